"""An actor that reads the envelope (ask flag, sender clock): replay must hand it
the very envelope it saw."""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Event, Message


class Peek(Message, frozen=True):
    n: int


class Peeked(Event, frozen=True):
    ask: bool
    src_hlc: int


class EnvState(msgspec.Struct, frozen=True):
    seen: tuple[tuple[bool, int], ...] = ()


class EnvReader(Actor[EnvState]):
    def initial_state(self) -> EnvState:
        return EnvState()

    def evolve(self, state: EnvState, event: Event) -> EnvState:
        assert isinstance(event, Peeked)
        return EnvState((*state.seen, (event.ask, event.src_hlc)))

    def handle(self, ctx: Context, msg: Message) -> None:
        env = ctx.env
        assert env is not None
        if isinstance(msg, Peek):
            ctx.record(Peeked(env.ask, env.hlc))
            if env.ask:
                ctx.reply(Peek(msg.n))
            elif msg.n > 0:
                ctx.ask("env/1", Peek(msg.n - 1), timeout_s=1.0)
