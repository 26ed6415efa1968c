"""AsyncDriver's wall-clock timers on uvloop, the loop `deepserve up` runs: each deadline is
armed on the loop's millisecond ticks (`asynctimers.ms_tick_delay`), so a timer never fires
before its deadline and the loop does not spin up to it."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from deepserve.core import Actor, Context, Event, MemorySink, Message
from deepserve.core.asyncdriver import AsyncDriver, run
from deepserve.core.asynctimers import ms_tick_delay
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


class AsyncTimerTick(Message, frozen=True):
    n: int


class Ticker(Actor[int]):
    """A chain of `n` timers `delay_s` apart."""

    def __init__(self, delay_s: float, n: int) -> None:
        self.delay_s = delay_s
        self.n = n

    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: object) -> int:
        return state

    def on_start(self, ctx: Context) -> None:
        ctx.after(self.delay_s, AsyncTimerTick(1))

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, AsyncTimerTick) and msg.n < self.n:
            ctx.after(self.delay_s, AsyncTimerTick(msg.n + 1))


def test_ms_tick_delay_rounds_up_to_the_loops_next_millisecond() -> None:
    assert ms_tick_delay(10.0023, 10.001) == pytest.approx(0.002)  # 1.3 ms: two ticks
    assert ms_tick_delay(10.0021, 10.001) == pytest.approx(0.002)
    assert ms_tick_delay(10.0009, 10.001) == 0.0  # due already: at once
    assert ms_tick_delay(10.001, 10.001) == 0.0


def test_uvloop_timers_fire_after_their_deadlines_without_spinning() -> None:
    pytest.importorskip("uvloop")
    chains, n = 4, 60

    async def main() -> tuple[int, list[float]]:
        late: list[float] = []
        async with AsyncDriver() as d:
            d.timer_late = lambda key, s: late.append(s)
            for i in range(chains):  # deadlines 1.3-2.2 ms apart: inside one or two ticks
                d.spawn(f"t/{i}", Ticker, delay_s=0.0013 + 0.0003 * i, n=n)
            await d.idle(timers=True)
            return d.timer_wakes, late

    wakes, late = run(main)
    assert len(late) == chains * n
    assert min(late) >= 0.0  # never before its deadline
    # one wake a timer at most (several due at one tick share it); re-arming a deadline under
    # half a millisecond away as uvloop's `call_soon` woke the loop ~100 times a timer here
    assert wakes <= chains * n


# ---- a due timer for a parked actor runs in the timer callback (`_deliver_timer`) -----------
class Beat(Message, frozen=True):
    n: int


class Beaten(Event, frozen=True):
    n: int


class Pacer(Actor[int]):
    """`n` beats `delay_s` apart; each is recorded and told to `to`; the third spawns a child
    (from the timer callback, when it runs inline), which is told the beats after it."""

    def __init__(self, to: str, delay_s: float, n: int) -> None:
        self.to, self.delay_s, self.n = to, delay_s, n

    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: Beaten) -> int:
        return state + event.n

    def on_start(self, ctx: Context) -> None:
        ctx.after(self.delay_s, Beat(1))

    def handle(self, ctx: Context, msg: Message) -> None:
        if not isinstance(msg, Beat):
            return
        ctx.record(Beaten(msg.n))
        ctx.send(self.to, Beat(msg.n))
        if msg.n == 3:
            ctx.spawn(f"{ctx.self}/kid", Keeper)
        if msg.n > 3:
            ctx.send(f"{ctx.self}/kid", Beat(msg.n))
        if msg.n < self.n:
            ctx.after(self.delay_s, Beat(msg.n + 1))


class Keeper(Actor[int]):
    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: Beaten) -> int:
        return state * 100 + event.n

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Beat):
            ctx.record(Beaten(msg.n))


def _per_actor(sink: MemorySink) -> dict[str, list[tuple[object, ...]]]:
    """Each actor's steps without their times: input type and payload, events, outputs."""
    out: dict[str, list[tuple[object, ...]]] = {}
    for s in sink.steps:
        i = s.input
        if i.seq < 0:  # final snapshots
            continue
        outs = tuple((o.kind, o.dst, o.type, o.payload, o.key) for o in s.outputs)
        out.setdefault(i.actor, []).append((i.seq, i.type, i.payload, tuple(e.payload for e in s.events), outs))
    return out


def _beats(inline: bool) -> tuple[MemorySink, int, dict[str, int]]:
    sink = MemorySink()

    async def main() -> tuple[int, dict[str, int]]:
        async with AsyncDriver(seed=5, sink=sink) as d:
            d.inline_local = inline
            d.spawn("k/0", Keeper)
            d.spawn("p/0", Pacer, to="k/0", delay_s=0.003, n=8)
            await d.idle(timers=True)
            await d.idle()
            states = {a: d.actor(a).state for a in ("k/0", "p/0", "p/0/kid")}
            return d.inline_deliveries, states

    inline_runs, states = run(main)
    return sink, inline_runs, states


def test_timers_run_inline_for_parked_actors_with_the_same_steps_as_through_their_tasks() -> None:
    fast, inline_runs, fast_states = _beats(inline=True)
    plain, no_inline, plain_states = _beats(inline=False)  # the readable path: `_send`, a task wake
    assert no_inline == 0
    # the 8 beats ran in the timer callback (p/0 was parked each time), and so did each beat's
    # first message, to k/0 (parked); the child's were in its own task or inline too
    assert inline_runs >= 16
    assert fast_states == plain_states == {"k/0": 102030405060708, "p/0": sum(range(1, 9)),
                                           "p/0/kid": 405060708}
    assert _per_actor(fast) == _per_actor(plain)
    for sink in (fast, plain):
        result = verify(MemoryLog(sink))  # type: ignore[arg-type]
        assert result.identical, result.summary()


class RefusingSink(MemorySink):
    """Refuses every step after the first `ok`: a disk that failed."""

    def __init__(self, ok: int) -> None:
        super().__init__()
        self.ok = ok

    def append(self, step: object) -> int:
        if len(self.steps) >= self.ok:
            raise OSError("disk full")
        return super().append(step)  # type: ignore[arg-type]


def test_a_sink_failure_in_a_timer_delivered_inline_fails_the_driver() -> None:
    # as it would in the actor's task: the loop only logs a callback's own exception
    async def main() -> None:
        async with AsyncDriver(sink=RefusingSink(ok=2)) as d:
            d.spawn("t/0", Ticker, delay_s=0.002, n=50)  # its Started and one more step logged
            with anyio.fail_after(10):
                await anyio.sleep_forever()

    with pytest.raises(ExceptionGroup) as failed:  # the driver's task group, failed by the OSError
        run(main)
    assert any(isinstance(e, OSError) and "disk full" in str(e) for e in failed.value.exceptions)


def test_a_timer_run_inline_may_spawn_on_a_loop_anyio_did_not_start() -> None:
    # `asyncio.run` (as a daemon thread or uvicorn starts a loop): in the timer callback nothing
    # told anyio which async library runs, and the child's task could not start
    async def main() -> dict[str, int]:
        async with AsyncDriver(seed=5) as d:
            d.spawn("k/0", Keeper)
            d.spawn("p/0", Pacer, to="k/0", delay_s=0.003, n=8)
            await d.idle(timers=True)
            await d.idle()
            assert d.inline_deliveries >= 16
            return {a: d.actor(a).state for a in ("k/0", "p/0", "p/0/kid")}

    states = asyncio.run(asyncio.wait_for(main(), 20))
    assert states == {"k/0": 102030405060708, "p/0": sum(range(1, 9)), "p/0/kid": 405060708}
