"""core/restore.py: a SimDriver restored at T from a log (replay/fork.py reads the image) makes
the log's own steps after T — actors' state folded from snapshots and events, delivery and output
counters (so `ctx.rng` and ids continue), HLCs, asks open, failed and answered late, restarts,
timers armed, re-armed and cancelled, all put back in their original order."""

from __future__ import annotations

import msgspec
import pytest
from restore_actors import Answerer, Asker

from deepserve.core import SimDriver
from deepserve.core.records import MemorySink
from deepserve.core.restore import restore_cell, restore_timer, set_clock
from deepserve.replay.fork import Cut
from deepserve.replay.inputs import _LIGHT

END_S = 60.0


def run(seed: int) -> list[bytes]:
    sink = MemorySink()
    driver = SimDriver(seed, sink=sink)
    driver.spawn("answerer", Answerer)
    driver.spawn("asker", Asker, peer="answerer")
    driver.run(until=END_S)
    return [msgspec.msgpack.encode(s) for s in sink.steps]


def restored(seed: int, steps: list[bytes], at: float) -> tuple[list[bytes], Cut]:
    cut = Cut(at)
    cut.page(_LIGHT.decode(b"\xdd" + len(steps).to_bytes(4, "big") + b"".join(steps)), b"")
    sink = MemorySink()
    driver = SimDriver(seed, sink=sink)
    for img in cut.images():
        restore_cell(driver, img)
    for tm in cut.pending_timers():
        restore_timer(driver, tm.deadline, tm.env, tm.key)
    set_clock(driver, cut.last_t, 2, cut.retired.items())
    driver.run(until=END_S)
    return [msgspec.msgpack.encode(s) for s in sink.steps], cut


@pytest.mark.parametrize("at", [3.3, 17.0, 41.7])
def test_restored_at_t_the_driver_makes_the_logs_steps_after_t(at: float) -> None:
    steps = run(seed=5)
    after = [s for s in steps if msgspec.msgpack.decode(s)[0][2] > at]
    kinds = [msgspec.msgpack.decode(s)[0] for s in steps]
    assert any(k[10] == "AskFailed" for k in kinds) and any(k[4] == 4 for k in kinds)  # timeouts, late answers
    assert any(k[10] == "RsPong" and k[4] == 0 for k in kinds)  # and answers in time
    mine, cut = restored(5, steps, at)
    assert cut.delivered > 10 and len(after) > 10
    assert not cut.unsure()
    assert mine == after


def test_a_failure_after_the_last_output_leaves_the_counter_unknown() -> None:
    """A failed delivery drops its outputs but not the ids they took: at a T right after it, the
    log cannot say the actor's output counter, and the cut says so (a what-if re-runs instead)."""
    steps = run(seed=5)
    failed = [d[0][2] for d in map(msgspec.msgpack.decode, steps) if any(e[3] == "HandlerFailed" for e in d[1])]
    assert failed
    cut = Cut(failed[0])
    cut.page(_LIGHT.decode(b"\xdd" + len(steps).to_bytes(4, "big") + b"".join(steps)), b"")
    assert cut.unsure() == ["asker"]
