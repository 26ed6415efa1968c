"""AsyncDriver's inline deliveries (`_drain_inline`): a message to an idle local actor runs
after the sender's step, in the sender's task, with each actor's order and the log unchanged."""

from __future__ import annotations

import asyncio

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


# ---- property: per-pair FIFO order with inline deliveries on ------------------------------
class Hop(Message, frozen=True):
    seq: int  # the sender's count of messages it sent to this receiver
    left: int  # hops still to go
    key: int  # picks the next targets


class Relay(Actor[None]):
    """Forwards each hop to one or two peers picked by its key; remembers, per sender, the
    `seq` of each arrival (the instrument, not actor state) and numbers what it sends per
    receiver."""

    def __init__(self, peers: int) -> None:
        self.peers = peers
        self.sent: dict[str, int] = {}

    def handle(self, ctx: Context, msg: Message) -> None:
        if not isinstance(msg, Hop):
            return
        ARRIVALS.setdefault((ctx.sender, ctx.self), []).append(msg.seq)
        if msg.left <= 0:
            return
        fan = 1 + msg.key % 2
        for j in range(fan):
            dst = f"r/{(msg.key // 2 + j * 7) % self.peers}"
            n = self.sent[dst] = self.sent.get(dst, 0) + 1
            ctx.send(dst, Hop(n, msg.left - 1, (msg.key * 31 + j + 1) % 1009))


ARRIVALS: dict[tuple[str, str], list[int]] = {}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(peers=st.integers(2, 6), starts=st.lists(st.integers(0, 1008), min_size=1, max_size=6),
       hops=st.integers(1, 5))
def test_every_sender_receiver_pair_stays_fifo_with_inline_deliveries(peers: int, starts: list[int], hops: int) -> None:
    ARRIVALS.clear()

    async def main() -> int:
        async with AsyncDriver(seed=3) as d:
            for i in range(peers):
                d.spawn(f"r/{i}", Relay, peers=peers)
            await d.idle()
            for n, key in enumerate(starts):
                d.inject_nowait(f"r/{key % peers}", Hop(n + 1, hops, key), src="ext/start")
            await d.idle()
            return d.inline_deliveries

    inline = anyio.run(main)
    crossed = any(src.startswith("r/") and src != dst for src, dst in ARRIVALS)
    if len(starts) == 1 and crossed:  # one chain from an idle node: its first hop found its target parked
        assert inline > 0
    for (src, dst), seqs in ARRIVALS.items():
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), (src, dst, seqs)
        if src.startswith("r/"):  # nothing lost between actors: 1..n, each once
            assert seqs == list(range(1, len(seqs) + 1)), (src, dst, seqs)
