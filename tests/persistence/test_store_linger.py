"""The thread writer's linger (`open_sink(..., linger_s=...)`, the daemon's): woken from idle, the
writer waits for more steps before it commits, so steps that trickle in one at a time (a daemon
under load) share a transaction instead of each paying a commit and a thread wake-up. And the
writer's SQLite page cache is the caller's to size (`cache_kib`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from store_testdata import run_rec

from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import GroupCommitSink, open_log, open_sink
from deepserve.persistence.sqlite.fresh import writer_pragmas

STEPS = 8
GAP_S = 0.02  # between two appends: the writer is idle again by then without a linger


def _step(i: int) -> Step:
    return Step(InputRec("a/1", i, float(i), i, 0, "ext/x", i, None, None, True, "T", b"p"), (), ())


class CountingStore:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def write(self, items: Sequence[Step | RunRec]) -> int:
        self.batches.append(len(items))
        return sum(1 for i in items if type(i) is Step)

    def close(self) -> None:
        return None


def _trickle(linger_s: float) -> list[int]:
    store = CountingStore()
    sink = GroupCommitSink(lambda: store, label="t", linger_s=linger_s)
    sink.begin_run(run_rec("r"))
    for i in range(1, STEPS + 1):
        sink.append(_step(i))
        time.sleep(GAP_S)
    sink.close()
    return store.batches[1:]  # after the run record's own


def test_steps_that_trickle_in_share_a_transaction_within_the_linger() -> None:
    alone = _trickle(0.0)
    lingered = _trickle(STEPS * GAP_S * 4)
    assert sum(alone) == sum(lingered) == STEPS
    assert len(alone) == STEPS  # a transaction a step
    assert len(lingered) <= 2


def test_linger_keeps_every_step_and_close_does_not_wait_it_out(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "l.db"), linger_s=1.0, cache_kib=1024)
    sink.begin_run(run_rec("r"))
    t0 = time.monotonic()
    for i in range(1, 4):
        sink.append(_step(i))
    sink.close()
    assert time.monotonic() - t0 < 0.9  # close wakes the lingering writer
    log = open_log(str(tmp_path / "l.db"))
    try:
        assert [s.input.seq for s in log.steps("r")] == [1, 2, 3]
    finally:
        log.close()


def test_linger_and_cache_are_checked() -> None:
    with pytest.raises(ValueError, match="linger_s"):
        GroupCommitSink(CountingStore, label="t", linger_s=-1.0)
    assert "cache_size=-8192" in writer_pragmas("async", cache_kib=8192)
    assert "cache_size=-65536" in writer_pragmas("async")


def test_a_flush_window_gathers_the_steps_of_a_window_into_one_commit() -> None:
    """`flush_s` (the daemon's): at most a commit a window, so a page holds a window's steps; a
    flush (or close) commits at once, without waiting the window out."""
    store = CountingStore()
    sink = GroupCommitSink(lambda: store, label="t", flush_s=5.0)
    sink.begin_run(run_rec("r"))  # committed at once: begin_run waits for it
    t0 = time.monotonic()
    for i in range(1, STEPS + 1):
        sink.append(_step(i))
        time.sleep(GAP_S)  # without the window: a commit a step (the test above)
    sink.flush()
    assert time.monotonic() - t0 < 4.0  # the flush cut the window short
    assert store.batches[1:] == [STEPS]
    for i in range(STEPS + 1, 2 * STEPS + 1):
        sink.append(_step(i))
    assert sink.wait_committed(2 * STEPS, timeout=4.0)  # a waiter cuts it short too
    sink.close()
    assert sum(store.batches[1:]) == 2 * STEPS and len(store.batches) == 3


def test_a_full_batch_ends_the_flush_window() -> None:
    store = CountingStore()
    sink = GroupCommitSink(lambda: store, label="t", flush_s=5.0, max_batch=4)
    sink.begin_run(run_rec("r"))
    for i in range(1, 5):
        sink.append(_step(i))
    t0 = time.monotonic()
    while sink.committed_ticket < 4 and time.monotonic() - t0 < 4.0:
        time.sleep(0.005)  # nobody waits on the sink: the full batch alone ends the window
    assert sink.committed_ticket == 4
    sink.close()


def test_the_flush_window_is_checked() -> None:
    with pytest.raises(ValueError, match="flush_s"):
        GroupCommitSink(CountingStore, label="t", flush_s=-1.0)
    with pytest.raises(ValueError, match="flush_s is for durability='async'"):
        GroupCommitSink(CountingStore, label="t", durability="outbox", flush_s=0.1)
