"""Designed overload: an AsyncDriver node driven at twice its sustainable rate sheds
load at its edge, tells every sender whose message it dropped, and recovers."""

from __future__ import annotations

import time

import anyio
import msgspec
import pytest
from overload_actors import Job, Result, Router, Worker

from deepserve.core import AsyncDriver, MemorySink
from deepserve.core.messages import AskFailed, Undelivered
from deepserve.core.records import DELIVERED, FULL

WORKERS = 4


async def _drive(
    d: AsyncDriver, rate_per_s: float, duration_s: float, first: int
) -> tuple[list[tuple[float, int]], list[float]]:
    """Offer jobs at `rate_per_s` for `duration_s` (wall) with `inject_nowait`;
    returns (offset, job) of the accepted ones and the offsets of refusals."""
    accepted, refused, n = [], [], first
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < duration_s:
        due = int(rate_per_s * elapsed) - (n - first)
        # After a stall of this process (a shared machine), catch up at most 10 ms of
        # work per tick, as a paced client would, rather than in one burst.
        for _ in range(min(due, max(1, int(rate_per_s * 0.01)))):
            if d.inject_nowait("router/0", Job(n), corr=str(n)):
                accepted.append((elapsed, n))
            else:
                refused.append(elapsed)
            n += 1
        await anyio.sleep(0.002)
        if due > rate_per_s * 0.01:  # skipped, not postponed: the client gave up on them
            n = first + int(rate_per_s * (time.monotonic() - start))
    return accepted, refused


def _outcomes(d: AsyncDriver) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for _, env in d.external_out:
        if isinstance(env.msg, Result):
            out.setdefault(env.msg.n, []).append(env.msg.outcome)
    return out


@pytest.mark.timeout(60)
async def test_twice_the_sustainable_rate_sheds_at_the_edge_and_recovers():
    sink = MemorySink()
    async with AsyncDriver(sink=sink, mailbox_capacity=64) as d:
        d.spawn("router/0", Router, workers=WORKERS)
        for i in range(WORKERS):
            d.spawn(f"w/{i}", Worker, spin=3000)
        await d.idle()
        # Sustainable rate, measured: the edge makes a fast producer wait.
        start = time.monotonic()
        for n in range(600):
            await d.inject("router/0", Job(n), corr=str(n))
        with anyio.fail_after(20):
            while len(_outcomes(d)) < 600:
                await anyio.sleep(0.005)
        rate = 600 / (time.monotonic() - start)
        # Twice that rate. The rate measured from one backlog can be below what the node
        # sustains (a shared machine stalled meanwhile; or idle workers run in the router's
        # task, AsyncDriver's inline deliveries), so if under a tenth was shed the drive
        # repeats at four, then eight times it (new job numbers).
        earlier: list[tuple[float, int]] = []  # accepted in a drive that shed too little
        for factor, first in ((2, 1_000_000), (4, 2_000_000), (8, 3_000_000)):
            over, over_refused = await _drive(d, factor * rate, 3.0, first)
            if len(over_refused) >= 0.1 * (len(over) + len(over_refused)):
                break
            earlier += over
        # Back to a normal rate: the backlog drains, then nothing is refused.
        calm, calm_refused = await _drive(d, 0.3 * rate, 3.0, 5_000_000)
        with anyio.fail_after(20):
            await d.idle(timers=True)
    outcomes = _outcomes(d)
    # Overloaded, the edge refused work; every accepted job ended exactly once.
    assert len(over_refused) > 0
    for n in [*range(600), *(n for _, n in (*earlier, *over, *calm))]:
        assert len(outcomes[n]) == 1, (n, outcomes.get(n))
    # It recovered: after 1.5 s at the normal rate nothing is shed, and the edge
    # refuses (almost) nothing — a machine shared with other work may stall the
    # loop for a moment, so a few refusals in a second are not a failure to recover.
    recovered = [n for at, n in calm if at >= 1.5]
    late_refused = [at for at in calm_refused if at >= 1.5]
    assert recovered and len(late_refused) <= 0.05 * (len(recovered) + len(late_refused))
    assert all(outcomes[n] == ["done"] for n in recovered)
    assert len(over_refused) >= 0.1 * (len(over) + len(over_refused))
    # Every message dropped between actors has a sender that was told.
    told = set()
    for s in sink.steps:
        if s.input.kind == DELIVERED and s.input.type in ("Undelivered", "AskFailed"):
            notice = msgspec.msgpack.decode(s.input.payload, type=Undelivered | AskFailed)
            rid = notice.msg_id if isinstance(notice, Undelivered) else notice.request_id
            told.add((s.input.actor, rid, notice.target))
    dropped = [
        (s.input.src, s.input.msg_id, s.input.actor)
        for s in sink.steps if s.input.kind == FULL and not s.input.src.startswith("ext/")
    ]
    assert all(drop in told for drop in dropped)
    print(f"rate {rate:.0f}/s; overload: {len(over)} accepted, {len(over_refused)} refused; "
          f"internal drops told: {len(dropped)}; calm: {len(calm)} accepted, "
          f"{len(calm_refused)} refused")


def _told_about_drops(sink: MemorySink) -> tuple[list, set]:
    told = set()
    for s in sink.steps:
        if s.input.kind == DELIVERED and s.input.type == "Undelivered":
            notice = msgspec.msgpack.decode(s.input.payload, type=Undelivered)
            told.add((s.input.actor, notice.msg_id, notice.target, notice.msg_type, notice.reason))
    dropped = [
        (s.input.src, s.input.msg_id, s.input.actor, s.input.type, "target mailbox is full")
        for s in sink.steps if s.input.kind == FULL and not s.input.src.startswith("ext/")
    ]
    return dropped, told


def test_sim_a_dropped_tell_is_told_to_its_sender():
    from kernel_actors import Counter, Forward

    from deepserve.core import SimDriver

    sink = MemorySink()
    d = SimDriver(sink=sink, mailbox_capacity=3)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    d.run()
    for _ in range(5):
        d.inject("c/0", Forward("c/1", 1))
    d.run()
    dropped, told = _told_about_drops(sink)
    assert len(dropped) == 2 and set(dropped) == told
    assert d.actor("c/1").state.total == 3


async def test_async_a_dropped_tell_is_told_even_past_the_senders_capacity():
    from kernel_actors import Counter, Spray, Sprayer

    sink = MemorySink()
    async with AsyncDriver(sink=sink, mailbox_capacity=4) as d:
        d.spawn("c/0", Sprayer)
        d.spawn("c/1", Counter)
        await d.idle()
        await d.inject("c/0", Spray("c/1", 10))  # 4 fit, 6 dropped: 6 notices to c/0
        await d.idle()
    dropped, told = _told_about_drops(sink)
    assert len(dropped) == 6 and set(dropped) == told
    assert d.actor("c/1").state.total == 4


class BehindSink(MemorySink):
    """A sink whose writer is behind until told otherwise (the `PressureSink` API)."""

    def __init__(self) -> None:
        super().__init__()
        self.behind = False

    @property
    def under_pressure(self) -> bool:
        return self.behind

    async def wait_for_room(self) -> None:
        while self.behind:
            await anyio.sleep(0.005)


async def test_a_saturated_sink_holds_external_input_at_the_edge():
    from kernel_actors import Add, Counter

    sink = BehindSink()
    async with AsyncDriver(sink=sink) as d:
        d.spawn("c/0", Counter)
        await d.idle()
        sink.behind = True
        assert d.inject_nowait("c/0", Add(1)) == 0 and d.refused == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(d.inject, "c/0", Add(2))
            await anyio.sleep(0.05)
            assert d.actor("c/0").state.total == 0  # the producer waits
            sink.behind = False
        await d.idle()
        assert d.actor("c/0").state.total == 2
