"""`JeConfig.quiet_accept` under a TE kill (tests/actors/je/test_quiet_accept.py has the rest): a
chat task sent straight to a master is never acknowledged and has no accept timeout, so a TE killed
while holding such tasks is found by the control plane alone (its membership push fails them; the
unstreamed ones are retried). The outcome is the one with every task acknowledged, streaming or
not, and the log replays."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from recovery_harness import build_run

from deepserve.actors.je.actor import JobExecutor
from deepserve.actors.workload.messages import RequestDone
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

_INIT = JobExecutor.__init__


def _kill_te(monkeypatch: pytest.MonkeyPatch, quiet: bool, stream: bool) -> tuple[Any, list[tuple[str, str, str]]]:
    def quiet_init(self: JobExecutor, config: dict[str, Any] | None = None) -> None:
        _INIT(self, {**(config or {}), "quiet_accept": quiet})

    monkeypatch.setattr(JobExecutor, "__init__", quiet_init)
    d, out = build_run([{"at_s": 2.0, "kind": "kill-te", "target": "te/1"}], stream=stream)
    done = sorted((m.request_id, m.status, m.reason) for m in out if isinstance(m, RequestDone))
    assert len({rid for rid, _, _ in done}) == len(done) == 36  # one terminal answer each
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    return d, done


@pytest.mark.parametrize("stream", [False, True])
def test_a_killed_te_s_unacknowledged_tasks_end_as_acknowledged_ones(monkeypatch: pytest.MonkeyPatch,
                                                                       stream: bool) -> None:  # fmt: skip
    loud, loud_done = _kill_te(monkeypatch, False, stream)
    quiet, quiet_done = _kill_te(monkeypatch, True, stream)
    assert quiet_done == loud_done
    statuses = Counter(status for _, status, _ in quiet_done)
    assert statuses == (Counter(completed=36) if not stream else Counter(completed=32, failed=4))
    acks = [sum(1 for s in d.sink.steps if s.input.type == "TaskAccepted") for d in (loud, quiet)]
    assert acks[1] < 10 < 36 <= acks[0]  # quiet: only the first task of each TE (through its shell)
