"""Actor classes shared by the kernel tests (importable by module path for replay)."""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Directive, Event, Message, ReplyHandle, Supervision
from deepserve.core.messages import AskFailed, ChildFailed, Undelivered


class Add(Message, frozen=True):
    n: int


class Boom(Message, frozen=True):
    after_record: bool = True


class Forward(Message, frozen=True):
    dst: str
    n: int


class AskIt(Message, frozen=True):
    dst: str
    timeout_s: float = 1.0


class SetTimer(Message, frozen=True):
    key: str
    delay_s: float
    n: int


class CancelTimer(Message, frozen=True):
    key: str


class SpawnChild(Message, frozen=True):
    addr: str


class StopOther(Message, frozen=True):
    addr: str


class StopSelf(Message, frozen=True):
    pass


class Added(Event, frozen=True):
    n: int


class Noted(Event, frozen=True):
    what: str


class Tally(msgspec.Struct, frozen=True):
    total: int = 0
    notes: tuple[str, ...] = ()


class Counter(Actor[Tally]):
    """Adds numbers; can fail, forward, ask, set timers, spawn and stop."""

    def initial_state(self) -> Tally:
        return Tally()

    def evolve(self, state: Tally, event: Event) -> Tally:
        if isinstance(event, Added):
            return Tally(state.total + event.n, state.notes)
        assert isinstance(event, Noted)
        return Tally(state.total, (*state.notes, event.what))

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            ctx.record(Added(msg.n))
            if ctx.env is not None and ctx.env.src != ctx.self and ctx.env.ask:
                ctx.reply(Add(self.state.total))
        elif isinstance(msg, Boom):
            if msg.after_record:
                ctx.record(Added(1000))
                ctx.send("nowhere/0", Add(1))
            raise RuntimeError("boom")
        elif isinstance(msg, Forward):
            ctx.send(msg.dst, Add(msg.n))
        elif isinstance(msg, AskIt):
            ctx.ask(msg.dst, Add(1), msg.timeout_s)
        elif isinstance(msg, AskFailed):
            ctx.record(Noted(f"askfailed:{msg.reason}"))
        elif isinstance(msg, SetTimer):
            ctx.after(msg.delay_s, Add(msg.n), key=msg.key)
        elif isinstance(msg, CancelTimer):
            ctx.cancel(msg.key)
        elif isinstance(msg, SpawnChild):
            ctx.spawn(msg.addr, Child)
        elif isinstance(msg, StopOther):
            ctx.stop(msg.addr)
        elif isinstance(msg, StopSelf):
            ctx.stop()
        elif isinstance(msg, ChildFailed):
            ctx.record(Noted(f"child:{msg.child}:{msg.error}"))
        elif isinstance(msg, Undelivered):
            ctx.record(Noted(f"undelivered:{msg.msg_type}#{msg.msg_id}:{msg.target}:{msg.reason}"))


class StopOnFailure(Counter):
    supervision = Supervision(directive=Directive.STOP)


class Child(Counter):
    supervision = Supervision(directive=Directive.ESCALATE)


class Fragile(Counter):
    supervision = Supervision(max_restarts=2, window_s=10.0)


class Opaque(Actor[object]):
    """Its state cannot be encoded: starting it must fail precisely, not crash the driver."""

    def initial_state(self) -> object:
        return object()

    def handle(self, ctx: Context, msg: Message) -> None:
        return None


class DictState(Actor[dict]):
    """A plain dict state holding tuples: a restart must give back tuples, not lists."""

    def initial_state(self) -> dict:
        return {"pairs": ()}

    def evolve(self, state: dict, event: Event) -> dict:
        assert isinstance(event, Added)
        return {"pairs": (*state["pairs"], (event.n, event.n))}

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            ctx.record(Added(msg.n))
        elif isinstance(msg, Boom):
            raise RuntimeError("boom")


class Sloppy(Actor[list]):
    """Breaks the rule: mutates `self.state` in place; its events change nothing."""

    def initial_state(self) -> list:
        return []

    def evolve(self, state: list, event: Event) -> list:
        return state

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            self.state.append(msg.n)
            ctx.record(Added(msg.n))


class Appender(Actor[list]):
    """Keeps the rule although `evolve` appends in place: state == fold of events."""

    def initial_state(self) -> list:
        return []

    def evolve(self, state: list, event: Event) -> list:
        assert isinstance(event, Added)
        state.append(event.n)
        return state

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            ctx.record(Added(msg.n))
        elif isinstance(msg, StopSelf):
            ctx.stop()


class Hoard(Actor[tuple]):
    """A large state changed by small events: snapshots must stay rare."""

    snapshot_every = 4

    def initial_state(self) -> tuple:
        return tuple(f"item-{i:05d}" for i in range(5000))

    def evolve(self, state: tuple, event: Event) -> tuple:
        assert isinstance(event, Added)
        return (*state[1:], f"item-{event.n:05d}")

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            ctx.record(Added(msg.n))


class Frequent(Counter):
    snapshot_every = 4


class Later(Message, frozen=True):
    handle: ReplyHandle
    n: int


class Slow(Actor[None]):
    """Answers an `Add` after `delay_s` (from a timer, through a saved reply handle)."""

    def __init__(self, delay_s: float = 2.0) -> None:
        self.delay_s = delay_s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Add):
            ctx.after(self.delay_s, Later(ctx.reply_handle(), msg.n))
        elif isinstance(msg, Later):
            ctx.reply(Add(msg.n), to=msg.handle)


class Asker(Actor[tuple]):
    """Asks on `AskIt`; records every answer with the envelope's reply_to."""

    def initial_state(self) -> tuple:
        return ()

    def evolve(self, state: tuple, event: Event) -> tuple:
        assert isinstance(event, Noted)
        return (*state, event.what)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, AskIt):
            rid = ctx.ask(msg.dst, Add(7), msg.timeout_s)
            ctx.record(Noted(f"asked:{rid}"))
        elif isinstance(msg, AskFailed):
            ctx.record(Noted(f"failed:{msg.request_id}:{ctx.env.reply_to}:{msg.target}:{msg.reason}"))
        elif isinstance(msg, Add):
            ctx.record(Noted(f"reply:{ctx.env.reply_to}:{msg.n}"))


class Spray(Message, frozen=True):
    dst: str
    k: int


class Sprayer(Counter):
    """Sends `k` messages in one handler (more than a mailbox holds)."""

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Spray):
            for _ in range(msg.k):
                ctx.send(msg.dst, Add(1))
        else:
            super().handle(ctx, msg)
