"""The heartbeat monitor's idle backoff (the daemon's `control.heartbeat_idle_max_interval_s`): an
idle daemon logged a heartbeat round a second, ~1 GB a day. Quiet rounds (every TE answered, no
forward pass outstanding) double the interval up to the cap; a busy answer brings it back at once,
and `HeartbeatWake` (a request arrived) makes the next tick one base interval away. A TE that dies
while backed off is still declared failed, and the log replays identically."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.heartbeat import HbTicked, HeartbeatMonitor, HeartbeatWake
from deepserve.actors.cluster.messages import (
    Heartbeat,
    HeartbeatAck,
    StopMonitor,
    TeFailed,
    WatchTe,
)
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.core.codec import decode
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


class Shell(Actor[dict]):
    """Acks every heartbeat; a forward pass is outstanding (`steps` 7) during [busy_from, busy_to);
    nothing after `dies_at_s`."""

    def __init__(self, busy_from: float = -1.0, busy_to: float = -1.0, dies_at_s: float = 1e9) -> None:
        self.busy_from, self.busy_to, self.dies_at_s = busy_from, busy_to, dies_at_s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Heartbeat) and ctx.now() < self.dies_at_s:
            busy = self.busy_from <= ctx.now() < self.busy_to
            ctx.send(msg.reply_to, HeartbeatAck(te=msg.te, generation=msg.generation, seq=msg.seq, ok=True,
                                                steps=(7 if busy else -1,)))  # fmt: skip


def run(cap_s: float, until_s: float, extra: tuple[tuple[float, Message], ...] = (), **shell: Any) -> tuple[SimDriver, list[Any]]:
    d = SimDriver(3, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda t, env: out.append((t, env.msg))
    d.spawn("hb", HeartbeatMonitor, config={"manager": "ext/cm", "interval_s": 1.0, "misses": 3,
                                            "idle_max_interval_s": cap_s})  # fmt: skip
    d.spawn("te/0/hb", Shell, **shell)  # the shell's fan-out
    d.inject("hb", WatchTe(te="te/0", generation=1), at=0.0)
    for at, m in extra:
        d.inject("hb", m, at=at)
    d.inject("hb", StopMonitor(), at=until_s)
    d.run(max_deliveries=100_000)
    return d, out


def tick_times(d: SimDriver) -> list[float]:
    steps = d.sink.steps  # type: ignore[attr-defined]
    return [s.input.t for s in steps if s.input.actor == "hb" and s.input.type == "HeartbeatTick"]


def test_quiet_rounds_double_the_interval_up_to_the_cap() -> None:
    d, _ = run(8.0, 60.0)
    # the first tick has nothing outstanding (quiet): 1, then +2, +4, +8, +8 ...
    assert tick_times(d) == [1, 3, 7, 15, 23, 31, 39, 47, 55]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_without_the_cap_the_interval_stays_put() -> None:
    d, _ = run(0.0, 6.5)
    assert tick_times(d) == [1, 2, 3, 4, 5, 6]
    events = [decode(e.type, e.payload) for s in d.sink.steps for e in s.events if e.type == "HbTicked"]  # type: ignore[attr-defined]
    assert all(isinstance(e, HbTicked) and e.next_s == 0.0 for e in events)


def test_a_busy_answer_resets_the_interval_and_a_wake_brings_the_next_tick_near() -> None:
    d, _ = run(8.0, 45.0, busy_from=22.0, busy_to=32.0, extra=((36.5, HeartbeatWake()),))
    # the pings of 23 and 31 find a pass outstanding: 1 s after each; the one of 32 does not:
    # quiet again (+1, +2, ...). At 36.5 a request arrives (the wake): the next tick at 37.5.
    assert tick_times(d) == [1, 3, 7, 15, 23, 31, 32, 33, 35, 37.5, 39.5, 43.5]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_te_that_dies_while_backed_off_is_still_declared_failed() -> None:
    d, out = run(8.0, 200.0, dies_at_s=20.0)
    failed = [(t, m.te) for t, m in out if isinstance(m, TeFailed)]
    # pinged at 15 (answered), 23 (not): misses at the ticks of 31, 32, 33 (a miss resets the interval)
    assert failed == [(33.0, "te/0")]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
