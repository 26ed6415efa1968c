"""A chat task the JE sends straight to a TE's only DP master is not acknowledged when the JE
asked the TE for it (`JeConfig.quiet_accept`, set by the assembly; `QuietAccepts`, recorded by
each master as `AcceptsQuieted`): one delivery a task less, and no accept timeout armed for it.
Only the tasks that still pass the TE shell (the JE has not learnt the master yet) are
acknowledged. The run simulates the same numbers as with every task acknowledged; a JE config
recorded before the flag existed keeps every acknowledgement, and a master no JE asked acks all."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.je.config import JeConfig
from deepserve.cluster import assembly
from deepserve.cluster.config import load
from deepserve.cluster.sim import run
from deepserve.core import MemorySink


def _run(monkeypatch: pytest.MonkeyPatch, quiet: bool) -> tuple[Any, MemorySink]:
    je_config = assembly.je_config
    monkeypatch.setattr(assembly, "je_config", lambda *a: {**je_config(*a), "quiet_accept": quiet})
    sink = MemorySink()
    return run(load("mooncake-16te", ("cluster.tes=4",)), requests=300, sink=sink), sink


def _accepted(sink: MemorySink) -> int:  # alone, or carrying a KV batch (kv_publish.TaskAnswerKv)
    alone = sum(1 for s in sink.steps if s.input.type == "TaskAccepted" and s.input.actor.startswith("je"))
    riding = sum(1 for s in sink.steps if s.input.type == "TaskAnswerKv" and b"TaskAccepted" in s.input.payload)
    return alone + riding


def _timers(sink: MemorySink) -> int:
    return sum(1 for s in sink.steps if s.input.actor.startswith("je")
               for o in s.outputs if o.type == "AcceptTimeout")  # fmt: skip


def test_direct_chat_tasks_go_unacknowledged_and_the_run_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    loud, loud_sink = _run(monkeypatch, False)
    quiet, quiet_sink = _run(monkeypatch, True)
    assert quiet.summary == loud.summary and quiet.summary["completed"] == 300
    via_shell = sum(1 for s in quiet_sink.steps if s.input.type == "SubmitTask" and "/dp/" not in s.input.actor)
    assert 0 < via_shell < 20  # the first task of each TE, before the JE knows its master
    assert _accepted(loud_sink) == 300 and _timers(loud_sink) == 300
    assert _accepted(quiet_sink) == via_shell and _timers(quiet_sink) == via_shell
    asked = sum(1 for s in quiet_sink.steps for e in s.events if e.type == "AcceptsQuieted")
    assert asked == 4 and not any(e.type == "AcceptsQuieted" for s in loud_sink.steps for e in s.events)
    assert quiet.deliveries < loud.deliveries


def test_configs_recorded_before_the_flag_acknowledge_every_task() -> None:
    assert JeConfig().quiet_accept is False and assembly.je_config(load("mooncake-16te").scheduling)["quiet_accept"]
