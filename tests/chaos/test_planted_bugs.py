"""Bugs planted in the platform (in this test only, by monkeypatching a method) are caught by the
chaos checkers with the right invariant, at a step that re-running the seed reaches again.

- a leaked KV block: a DP master ends one request's task without freeing its blocks;
- a duplicated terminal record: the gateway answers one request twice;
- a skipped token: a DP master streams one request's 4th token with the 5th's index.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import pytest

from deepserve.actors.flowserve.master import actor as master_actor
from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.master.output import finished_message
from deepserve.actors.flowserve.master.state import TaskEnded
from deepserve.actors.gateway.actor import Gateway
from deepserve.chaos.invariants import Checker
from deepserve.chaos.platform import load_config
from deepserve.chaos.runner import run_seed

SEED, REQUESTS = 3, 16
TARGET = "r2"  # the request the planted bug hits
SCENARIO = load_config("mooncake-16te", ["cluster.tes=3"])


@pytest.fixture
def seen(monkeypatch: Any) -> list[tuple[float, str]]:
    """(virtual time, actor) where the planted bug struck, appended by the plant; `struck` gets
    the step (the checker's count of deliveries) after which the first one was seen."""
    out: list[tuple[float, str]] = []
    real_call = Checker.__call__

    def counting(self: Checker, driver: Any) -> None:
        real_call(self, driver)
        if out and not struck:
            struck.append(self.step)

    struck.clear()
    monkeypatch.setattr(Checker, "__call__", counting)
    return out


struck: list[int] = []


def _run(tmp_path: Any) -> Any:
    return run_seed(SCENARIO, SEED, REQUESTS, str(tmp_path))


def test_the_unplanted_seed_passes(tmp_path: Any, monkeypatch: Any) -> None:
    completed: list[str] = []

    def spy(self: DpMaster, ctx: Any, r: Any, status: str, reason: str) -> None:
        if status == "completed":
            completed.append(r.task.request_id)
        real_end(self, ctx, r, status, reason)

    real_end = DpMaster.end
    monkeypatch.setattr(DpMaster, "end", spy)
    r = _run(tmp_path)
    assert TARGET in completed  # the request the bugs are planted in completes (its task ends once)
    assert r.violations == 0 and r.first is None and r.log == ""
    assert r.requests == REQUESTS and r.faults_injected > 0
    assert r.tokens_streamed >= r.completed > 0  # the token checker followed every stream
    assert os.listdir(tmp_path) == []  # a passing seed's log is dropped


def test_a_leaked_block_is_caught_as_kv_blocks(tmp_path: Any, monkeypatch: Any, seen: list) -> None:
    def leaky_end(self: DpMaster, ctx: Any, r: Any, status: str, reason: str) -> None:
        if r.task.request_id != TARGET or status != "completed":
            return real_end(self, ctx, r, status, reason)
        seen.append((ctx.now(), ctx.self))
        # the bug: the task ends without `rtc.free` of its block table
        ctx.record(TaskEnded(task_id=r.task.task_id, status=status, reason=reason))
        ctx.send(r.task.reply_to, finished_message(r, status, reason, ctx.now(), self.cfg), corr=r.task.request_id)

    real_end = DpMaster.end
    monkeypatch.setattr(DpMaster, "end", leaky_end)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "kv-blocks" and "left behind" in v.detail and TARGET in v.detail
    assert (v.t_s, v.actor, v.step) == (round(seen[0][0], 6), seen[0][1], struck[0])
    assert r.log and os.path.exists(r.log)  # a failing seed keeps its log
    again = _run(tmp_path)  # the same seed: the same first violation, at the same step
    assert again.first == v and again.violations == r.violations


def test_a_duplicated_terminal_record_is_caught_as_terminal(tmp_path: Any, monkeypatch: Any, seen: list) -> None:
    def twice(self: Gateway, ctx: Any, m: Any) -> None:
        c = self.state.clients.get(m.request_id)
        real_done(self, ctx, m)
        if m.request_id == TARGET and c is not None:
            seen.append((ctx.now(), ctx.self))
            ctx.send(c.reply_to, m, corr=m.request_id)  # the bug: a second answer

    real_done = Gateway._done
    monkeypatch.setattr(Gateway, "_done", twice)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "terminal" and "second terminal state" in v.detail
    assert v.detail.startswith(f"{TARGET}:") and (v.t_s, v.actor, v.step) == (round(seen[0][0], 6), seen[0][1], struck[0])


def test_a_skipped_token_is_caught_as_tokens(tmp_path: Any, monkeypatch: Any, seen: list) -> None:
    def skipping(r: Any, first: int, times_s: Any, cfg: Any) -> Any:
        msg = real_token_message(r, first, times_s, cfg)
        if r.task.request_id == TARGET and first == 3:
            seen.append((times_s[0], r.task.task_id))
            return msgspec.structs.replace(msg, first_index=4)  # the bug: token 3 goes out as 4
        return msg

    real_token_message = master_actor.token_message
    monkeypatch.setattr(master_actor, "token_message", skipping)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "tokens" and "skipped" in v.detail and v.detail.startswith(f"{TARGET}:")
    # (seen twice: the run, then its replay, which re-executes the same code)
    assert v.actor.endswith("/dp/0") and v.t_s == round(seen[0][0], 6) and v.step == struck[0]


def test_a_nondeterministic_handler_is_caught_as_replay(tmp_path: Any, monkeypatch: Any) -> None:
    """A handler reading state outside the actor (here: whether it ran before in this process)
    records what re-execution cannot reproduce: the log does not replay identically."""
    calls: list[str] = []

    def remembering(self: DpMaster, ctx: Any, r: Any, status: str, reason: str) -> None:
        calls.append(r.task.task_id)  # the bug: process state, not the actor's
        real_end(self, ctx, r, status, reason if len(calls) > 1 else reason + " (first in this process)")

    real_end = DpMaster.end
    monkeypatch.setattr(DpMaster, "end", remembering)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "replay" and r.violations == 1
    assert v.detail.startswith(f"the log does not replay identically: first divergence at {v.actor} seq ")
    assert v.actor.endswith("/dp/0") and v.step > 0 and r.log


def test_a_migrated_stream_that_repeats_a_token_is_caught_as_migration(tmp_path: Any, monkeypatch: Any,
                                                                       seen: list) -> None:  # fmt: skip
    """The bug: a resumed task (a migrated stream, `SubmitTask.resume_from`) samples each token
    from the index before its own — its first token is the client's last one again, and so on:
    a duplicate in the stream the client reads. With the seed's streams migrating (the unplanted
    seed takes some over and passes, test below), the checker names the first repeated token."""
    from deepserve.actors.flowserve.master import output
    from deepserve.actors.flowserve.sampling import sampled_tokens as real_sampled

    def shifted(r: Any, first: int, times_s: Any, cfg: Any) -> Any:
        msg = real_token_message(r, first, times_s, cfg)
        if r.task.resume_from and msg.token_ids:
            seen.append((times_s[0], r.task.task_id))
            return msgspec.structs.replace(msg, token_ids=real_sampled(r.task.sampling, first - 1, len(times_s), cfg.vocab))
        return msg

    real_token_message = output.token_message
    monkeypatch.setattr(master_actor, "token_message", shifted)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "migration" and "a duplicate or a lost token" in v.detail, r.listed
    assert "re-sent token" in v.detail and v.actor.endswith("/dp/0") and v.step == struck[0]


def test_a_migrated_stream_resumed_past_the_client_is_caught_as_missing(tmp_path: Any, monkeypatch: Any) -> None:
    """The bug: the JE resumes a migrated stream 5 tokens past what its client has."""
    from deepserve.actors.je import core as je_core

    real = je_core.M.TaskMigrated

    def ahead(**kw: Any) -> Any:
        return real(**{**kw, "resume_from": kw["resume_from"] + 40})

    monkeypatch.setattr(je_core.M, "TaskMigrated", ahead)
    r = _run(tmp_path)
    v = r.first
    assert v is not None and v.invariant == "migration" and "missing" in v.detail and "took the stream over" in v.detail, r.listed


def test_the_unplanted_seed_migrates_streams_and_passes(tmp_path: Any) -> None:
    r = _run(tmp_path)
    assert r.violations == 0 and r.taken_over >= 1 and r.failed == 0, (r.listed, r.taken_over, r.failed_reasons)
