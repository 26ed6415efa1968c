"""The heartbeat monitor's timing (a dead TE declared failed at exactly the N-th missed tick), that
it never keeps a simulation running (no ticks without watched TEs, none after `StopMonitor`), and
the DP master's answer rule (silent while the same pass stays outstanding)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from deepserve.actors.cluster.heartbeat import HeartbeatMonitor
from deepserve.actors.cluster.liveness import answer_heartbeat
from deepserve.actors.cluster.messages import (
    DpHeartbeat,
    DpHeartbeatAck,
    Heartbeat,
    HeartbeatAck,
    StopMonitor,
    TeFailed,
    WatchTe,
)
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


class FakeShell(Actor[dict]):
    """Acks every heartbeat while alive (before `dies_at_s`), `lag_s` after it came, then answers nothing."""

    def __init__(self, dies_at_s: float = 1e9, lag_s: float = 0.0) -> None:
        self.dies_at_s, self.lag_s = dies_at_s, lag_s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Heartbeat) and ctx.now() < self.dies_at_s:
            ack = HeartbeatAck(te=msg.te, generation=msg.generation, seq=msg.seq, ok=True)
            if self.lag_s:
                ctx.after(self.lag_s, ack, key=f"ack{msg.seq}")
            else:
                ctx.send(msg.reply_to, ack)
        elif isinstance(msg, HeartbeatAck):  # the delayed answer, due now
            ctx.send("hb", msg)


def monitor(tes: dict[str, float], extra: tuple[tuple[float, str, Message], ...] = (),
            lag_s: float = 0.0) -> tuple[SimDriver, list[Any]]:  # fmt: skip
    d = SimDriver(2, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda t, env: out.append((t, env.msg))
    d.spawn("hb", HeartbeatMonitor, config={"manager": "ext/cm", "interval_s": 1.0, "misses": 3})
    for te, dies in tes.items():
        d.spawn(f"{te}/hb", FakeShell, dies_at_s=dies, lag_s=lag_s)  # the shell's fan-out
        d.inject("hb", WatchTe(te=te, generation=4), at=0.0)
    for at, dst, m in extra:
        d.inject(dst, m, at=at)
    d.run(max_deliveries=100_000)  # must end on its own
    return d, out


def test_a_dead_te_is_declared_failed_at_the_third_missed_tick_and_ticks_then_stop() -> None:
    d, out = monitor({"te/1": 4.5}, extra=((12.0, "hb", WatchTe(te="te/9", generation=1)),))
    failed = [(t, m) for t, m in out if isinstance(m, TeFailed)]
    # acked at 1..4; the heartbeat of t=5 goes unanswered: misses counted at 6, 7, 8
    assert [(t, m.te, m.generation) for t, m in failed] == [(8.0, "te/1", 4), (16.0, "te/9", 1)]
    assert "3 heartbeats missed in a row (last: no answer within 1s)" == failed[0][1].reason
    # te/9 is no actor: pinged at 13, missed at 14, 15, 16; then nothing is watched, no timer left
    assert d.now == 16.0
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_live_te_answering_late_is_never_declared_failed_and_a_dead_one_still_is() -> None:
    # every answer comes 1.5 intervals late (after the next ping): each tick counts one miss, the
    # late answer that follows resets the count, so only the TE that stops answering fails
    d, out = monitor({"te/0": 1e9, "te/1": 6.2}, extra=((20.0, "hb", StopMonitor()),), lag_s=1.5)
    failed = [(t, m.te) for t, m in out if isinstance(m, TeFailed)]
    # te/1 answers the pings of t=1..6 (the last at 7.5); ticks at 8, 9, 10 see nothing new
    assert failed == [(10.0, "te/1")]
    assert d.actor("hb").state.watched["te/0"].acked >= 17
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_stop_monitor_ends_the_ticks_while_tes_are_watched() -> None:
    d, out = monitor({"te/0": 1e9}, extra=((3.5, "hb", StopMonitor()), (5.0, "hb", WatchTe(te="te/1", generation=1))))
    assert d.now == 5.0 and not [m for _, m in out if isinstance(m, TeFailed)]
    assert d.actor("hb").state.stopped and d.actor("hb").state.seq == 3


class FakeCtx:
    def __init__(self) -> None:
        self.replies: list[Any] = []

    def reply(self, msg: Any) -> None:
        self.replies.append(msg)


def master(step: int | None, launched: bool = True) -> Any:
    fl = None if step is None else SimpleNamespace(step=step, launched=launched, iterations=1)
    return SimpleNamespace(state=SimpleNamespace(in_flight=fl, device_lost=""), cfg=SimpleNamespace(dp=2))


def test_a_master_is_silent_only_while_the_same_pass_stays_outstanding() -> None:
    cases = [(master(None), -1, DpHeartbeatAck(dp=2, seq=1, step=-1)),  # idle
             (master(7, launched=False), 7, DpHeartbeatAck(dp=2, seq=1, step=-1)),  # planned, not on the NPU
             (master(7), 6, DpHeartbeatAck(dp=2, seq=1, step=7)),  # a new pass since the last heartbeat
             (master(7), 7, None)]  # the same pass still outstanding: the loop is stuck
    for m, last, want in cases:
        ctx = FakeCtx()
        answer_heartbeat(m, ctx, DpHeartbeat(seq=1, last_step=last))  # type: ignore[arg-type]
        assert ctx.replies == ([want] if want is not None else [])
