"""Actors for tests/core/test_restore.py (importable by module path: a restore builds them from
their logged `Started`)."""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Event, Message, ReplyHandle
from deepserve.core.messages import AskFailed


class RsTick(Message, frozen=True):
    n: int


class RsPing(Message, frozen=True):
    n: int


class RsPong(Message, frozen=True):
    n: int


class RsTicked(Event, frozen=True):
    n: int
    draw: float


class RsAnswered(Event, frozen=True):
    ok: bool


class AskerState(msgspec.Struct):
    ticks: int = 0
    total: float = 0.0
    answered: int = 0
    failed: int = 0


class Asker(Actor[AskerState]):
    """Ticks on a re-armed timer with a random delay, asks the answerer each tick (some asks time
    out, some answers come late), keeps a second timer it re-arms and cancels, and fails a
    handler now and then (restarted; its later outputs show where its output counter went)."""

    snapshot_every = 8

    def __init__(self, peer: str) -> None:
        self.peer = peer

    def initial_state(self) -> AskerState:
        return AskerState()

    def evolve(self, state: AskerState, event: Event) -> AskerState:
        if isinstance(event, RsTicked):
            state.ticks += 1
            state.total += event.draw
        elif isinstance(event, RsAnswered):
            state.answered += event.ok
            state.failed += not event.ok
        return state

    def on_start(self, ctx: Context) -> None:
        ctx.after(0.5, RsTick(n=0), key="tick")

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RsTick):
            draw = ctx.rng.random()
            ctx.record(RsTicked(n=msg.n, draw=draw))
            if msg.n < 0:  # the slow timer: a timer set (its id taken), then a failure the supervisor restarts
                ctx.after(1.0, RsTick(n=-2), key="dropped")
                raise RuntimeError("a failure the supervisor restarts")
            ctx.ask(self.peer, RsPing(n=msg.n), timeout_s=0.3 + draw)
            ctx.after(0.2 + draw, RsTick(n=msg.n + 1), key="tick")
            if msg.n % 5 == 0:
                ctx.after(1.5, RsTick(n=-1), key="slow")
            elif msg.n % 7 == 1:
                ctx.cancel("slow")
        elif isinstance(msg, RsPong):
            ctx.record(RsAnswered(ok=True))
        elif isinstance(msg, AskFailed):
            ctx.record(RsAnswered(ok=False))


class RsLater(Message, frozen=True):
    to: ReplyHandle
    n: int


class Answerer(Actor[None]):
    """Answers a ping after a random delay (a timer holding the reply handle): sometimes after
    the asker's timeout (a late answer, recorded and not delivered)."""

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RsPing):
            ctx.after(ctx.rng.random(), RsLater(to=ctx.reply_handle(), n=msg.n), key=f"answer{msg.n}")
        elif isinstance(msg, RsLater):
            ctx.reply(RsPong(n=msg.n), to=msg.to)
