"""AsyncDriver's wall-clock timers on uvloop, the loop `deepserve up` runs: each deadline is
armed on the loop's millisecond ticks (`asynctimers.ms_tick_delay`), so a timer never fires
before its deadline and the loop does not spin up to it."""

from __future__ import annotations

import pytest

from deepserve.core import Actor, Context, Message
from deepserve.core.asyncdriver import AsyncDriver, run
from deepserve.core.asynctimers import ms_tick_delay


class Tick(Message, frozen=True):
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
        ctx.after(self.delay_s, Tick(1))

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Tick) and msg.n < self.n:
            ctx.after(self.delay_s, Tick(msg.n + 1))


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
