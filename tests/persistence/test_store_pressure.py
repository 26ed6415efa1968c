"""Writer backpressure by design: under a slow disk the sink says it is behind
(`under_pressure`, `await wait_for_room()`, `statistics()`), so a producer at the
edge waits and `append` never blocks the event loop; the hard bound stays the last
resort for traffic that ignores the signal."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from store_testdata import run_rec

from deepserve.core.records import InputRec, RunRec, Step
from deepserve.persistence import GroupCommitSink, MemoryStore, open_log, open_sink

PER_REQUEST = 5  # logged deliveries per admitted request, as in the overload soak


def _step(i: int) -> Step:
    return Step(InputRec("a/1", i, float(i), i, 0, "ext/x", i, None, None, True, "T", b"p"), (), ())


class SlowDisk:
    """A backend whose every transaction takes `seconds` (a disk that fell behind)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.steps: list[int] = []

    def write(self, items: Sequence[Step | RunRec]) -> int:
        time.sleep(self.seconds)
        got = [i.input.seq for i in items if type(i) is Step]
        self.steps += got
        return len(got)

    def close(self) -> None:
        return None


async def _edge_producer(sink: GroupCommitSink, requests: int) -> int:
    """Admit `requests`, each logging PER_REQUEST steps; wait for room at the edge.
    Returns how many admissions found the sink under pressure."""
    waited = 0
    n = 0
    for _ in range(requests):
        if sink.under_pressure:
            waited += 1
        await sink.wait_for_room()
        for _ in range(PER_REQUEST):
            sink.append(_step(n))
            n += 1
        await anyio.sleep(0)  # the rest of the event loop runs between admissions
    return waited


async def test_a_producer_at_the_edge_waits_and_append_never_blocks() -> None:
    disk = SlowDisk(0.004)
    sink = GroupCommitSink(lambda: disk, label="slow", max_pending=400, max_batch=32)
    sink.begin_run(run_rec("r"))
    waited = await _edge_producer(sink, 600)
    stats = sink.statistics()
    sink.close()
    assert waited > 0  # the disk did fall behind: the signal was used
    assert stats.blocked_appends == 0 and stats.blocked_s == 0.0  # the loop never stalled
    assert stats.high_water == 200 and stats.low_water == 100
    assert stats.peak_pending < stats.high_water + PER_REQUEST
    assert disk.steps == list(range(600 * PER_REQUEST))  # nothing lost, in order


def test_traffic_ignoring_the_signal_meets_the_hard_bound() -> None:
    """The last resort, as before: append blocks its thread; memory stays bounded."""
    disk = SlowDisk(0.004)
    sink = GroupCommitSink(lambda: disk, label="slow", max_pending=64, max_batch=16)
    sink.begin_run(run_rec("r"))
    for i in range(600):
        sink.append(_step(i))
    stats = sink.statistics()
    sink.close()
    assert stats.blocked_appends > 0 and stats.blocked_s > 0
    assert stats.peak_pending <= 64 + 16 + 1  # the queue, one batch in flight, this step
    assert disk.steps == list(range(600))


async def test_wait_for_room_ends_when_the_sink_closes() -> None:
    gate = threading.Event()

    class Stuck(SlowDisk):
        def write(self, items: Sequence[Step | RunRec]) -> int:
            if any(type(i) is Step for i in items):
                gate.wait()
            return super().write(items)

    disk = Stuck(0)
    sink = GroupCommitSink(lambda: disk, label="stuck", max_pending=8, high_water=4)
    sink.begin_run(run_rec("r"))
    for i in range(6):
        sink.append(_step(i))
    assert sink.under_pressure
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sink.wait_for_room)
            await anyio.sleep(0.05)
            gate.set()  # the disk catches up: the waiter is released
    sink.close()
    assert not sink.under_pressure and disk.steps == list(range(6))


async def test_process_writer_speaks_the_same_pressure_protocol(tmp_path: Path) -> None:
    path = str(tmp_path / "p.db")
    sink = open_sink(path, writer="process", max_pending=1024, max_batch=128)
    sink.begin_run(run_rec("r"))
    n = 0
    for _ in range(2000):
        await sink.wait_for_room()
        for _ in range(PER_REQUEST):
            sink.append(_step(n))
            n += 1
    stats = sink.statistics()
    sink.close()
    assert stats.blocked_appends == 0 and stats.appended == n
    assert stats.high_water == 512 and stats.peak_pending <= 1024
    with open_log(path) as log:
        assert sum(1 for _ in log.steps()) == n


@pytest.mark.parametrize("sink_kind", ["memory", "thread"])
def test_statistics_count_commits(sink_kind: str, tmp_path: Path) -> None:
    sink = MemoryStore() if sink_kind == "memory" else open_sink(str(tmp_path / "s.db"))
    sink.begin_run(run_rec("r"))
    for i in range(10):
        sink.append(_step(i))
    sink.flush()
    stats = sink.statistics()
    assert (stats.appended, stats.committed, stats.pending) == (10, 10, 0)
    assert not sink.under_pressure
    sink.close()
