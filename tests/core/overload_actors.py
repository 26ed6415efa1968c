"""A router in front of workers that spend real CPU per job: overload tests."""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Event, Message
from deepserve.core.messages import Undelivered


class Job(Message, frozen=True):
    n: int


class Work(Message, frozen=True):
    n: int


class Done(Message, frozen=True):
    n: int


class Resend(Message, frozen=True):
    n: int


class Result(Message, frozen=True):
    n: int
    outcome: str  # "done" | "shed"


class Finished(Event, frozen=True):
    n: int
    ok: bool


class RouterState(msgspec.Struct, frozen=True):
    done: int = 0
    shed: int = 0


class Router(Actor[RouterState]):
    """Spreads jobs over workers; every job ends in one `Result` to the outside."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def initial_state(self) -> RouterState:
        return RouterState()

    def evolve(self, state: RouterState, event: Event) -> RouterState:
        assert isinstance(event, Finished)
        if event.ok:
            return RouterState(state.done + 1, state.shed)
        return RouterState(state.done, state.shed + 1)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Job):
            ctx.send(f"w/{msg.n % self.workers}", Work(msg.n), corr=str(msg.n))
        elif isinstance(msg, Done):
            ctx.record(Finished(msg.n, True))
            ctx.send("ext/out", Result(msg.n, "done"))
        elif isinstance(msg, Undelivered):  # a worker's mailbox was full: shed the job
            n = int(ctx.corr or -1)
            ctx.record(Finished(n, False))
            ctx.send("ext/out", Result(n, "shed"))


class Worker(Actor[None]):
    """Spends `spin` loop iterations per job; retries a dropped answer."""

    def __init__(self, spin: int) -> None:
        self.spin = spin

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Work):
            x = 0
            for i in range(self.spin):
                x += i
            ctx.send("router/0", Done(msg.n))
        elif isinstance(msg, Undelivered):  # the router was full: answer again soon
            ctx.after(0.002, Resend(int(ctx.corr or -1)))
        elif isinstance(msg, Resend):
            ctx.send("router/0", Done(msg.n), corr=str(msg.n))
