"""AsyncDriver's inline deliveries (`_drain_inline`): a message to an idle local actor runs
after the sender's step, in the sender's task, with each actor's order and the log unchanged."""

from __future__ import annotations

import asyncio

import anyio

from deepserve.core import Actor, AsyncDriver, Context, MemorySink, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


class InlineNote(Message, frozen=True):
    n: int


class InlineQuit(Message, frozen=True):
    pass


class Fan(Actor[None]):
    """On `InlineNote(k)` from outside: sends `to` the notes k, k+1, k+2 in one step, and asks `ask`."""

    def __init__(self, to: str, ask: str) -> None:
        self.to, self.ask_to = to, ask

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, InlineNote) and ctx.sender.startswith("ext/"):
            for i in range(3):
                ctx.send(self.to, InlineNote(msg.n + i))
            ctx.ask(self.ask_to, InlineNote(-msg.n), 5.0)


class Keep(Actor[list[int]]):
    """Keeps what it is sent, in order; answers an ask; stops on `InlineQuit`."""

    def initial_state(self) -> list[int]:
        return []

    def evolve(self, state: list[int], event: InlineNote) -> list[int]:
        return [*state, event.n]

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, InlineNote):
            ctx.record(InlineNote(msg.n))
            if msg.n < 0:  # the asks (see Fan)
                ctx.reply(InlineNote(msg.n * 10))
        elif isinstance(msg, InlineQuit):
            ctx.stop()


class Stopper(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        ctx.send("k/0", InlineQuit())  # k/0 is idle: runs inline, and stops


async def _until(cond, timeout_s: float = 10.0) -> None:
    with anyio.fail_after(timeout_s):
        while not cond():
            await anyio.sleep(0.002)


async def test_idle_actors_run_in_the_senders_task_in_order_and_the_log_verifies() -> None:
    sink = MemorySink()
    async with AsyncDriver(sink=sink) as d:
        d.spawn("k/0", Keep)
        d.spawn("k/1", Keep)
        d.spawn("f/0", Fan, to="k/0", ask="k/1")
        await d.idle()
        before = d.inline_deliveries
        await d.inject("f/0", InlineNote(1))
        await d.idle()
        await d.inject("f/0", InlineNote(7))
        await d.idle()
        assert d.cells["k/0"].actor.state == [1, 2, 3, 7, 8, 9]  # a burst keeps its order
        assert d.cells["k/1"].actor.state == [-1, -7]
        # Each round the ask ran inline (k/1 was idle); the burst went to k/0's own task (its
        # first note put in front of the other two), and the answer to f/0, whose task was running.
        assert d.inline_deliveries - before == 2
    result = verify(MemoryLog(sink))  # type: ignore[arg-type]
    assert result.identical, result.summary()


async def test_an_actor_stopped_inline_leaves_its_task_and_later_mail_is_dead() -> None:
    sink = MemorySink()
    async with AsyncDriver(sink=sink) as d:
        d.spawn("k/0", Keep)
        d.spawn("q/0", Keep)
        await d.idle()
        d.spawn("s/0", Stopper)
        await d.idle()
        before = d.inline_deliveries
        await d.inject("s/0", InlineNote(0))
        await d.idle()
        assert d.inline_deliveries == before + 1 and "k/0" not in d.cells
        await _until(lambda: "actor k/0" not in {t.get_name() for t in asyncio.all_tasks()})  # its task left
        d.inject_nowait("k/0", InlineNote(5))  # nobody there now: a dead letter
    assert d.dead_letters == 1


def test_sim_and_async_agree_on_what_each_actor_saw() -> None:
    # The same inputs through SimDriver: the same per-actor order (inline changes no order).
    sim = SimDriver(1)
    sim.spawn("k/0", Keep)
    sim.spawn("k/1", Keep)
    sim.spawn("f/0", Fan, to="k/0", ask="k/1")
    sim.run()
    sim.inject("f/0", InlineNote(1))
    sim.inject("f/0", InlineNote(7), at=1.0)
    sim.run()
    assert sim.actor("k/0").state == [1, 2, 3, 7, 8, 9] and sim.actor("k/1").state == [-1, -7]
