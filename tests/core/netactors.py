"""Scripted actors for random networks (determinism tests).

Importable by module path (`netactors:NetNode`) because a log's `Started` input
names the class: a replay in another process needs `tests/core` on PYTHONPATH.
Every choice a node makes comes from `ctx.rng`, so the network's behaviour is a
function of the run seed and the external inputs alone.
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

import msgspec

from deepserve.core import Actor, Context, Directive, Event, Message, SimDriver, Supervision
from deepserve.core.actor import class_path
from deepserve.core.messages import Started
from deepserve.core.records import LogSink


class NetPing(Message, frozen=True):
    hops: int
    tag: int


class NetTick(Message, frozen=True):
    tag: int


class NetPong(Message, frozen=True):
    tag: int


class NetSeen(Event, frozen=True):
    tag: int
    draw: float
    src: str


class NetNote(Event, frozen=True):
    what: str


class NetState(msgspec.Struct):
    seen: int = 0
    total: float = 0.0
    notes: int = 0
    last_src: str = ""


class NetNode(Actor[NetState]):
    """Fans pings out to random peers; sets timers, asks, spawns, stops, fails."""

    supervision: ClassVar[Supervision] = Supervision(max_restarts=3, window_s=5.0)
    snapshot_every: ClassVar[int] = 3  # small, so snapshots appear in every log

    def __init__(
        self,
        peers: list[str],
        fanout: int = 2,
        p_timer: float = 0.2,
        p_spawn: float = 0.05,
        p_stop: float = 0.02,
        p_fail: float = 0.05,
        p_ask: float = 0.1,
        depth: int = 0,
    ) -> None:
        self.peers = peers
        self.fanout = fanout
        self.p = (p_timer, p_spawn, p_stop, p_fail, p_ask)
        self.depth = depth

    def initial_state(self) -> NetState:
        return NetState()

    def evolve(self, s: NetState, e: Event) -> NetState:
        if isinstance(e, NetSeen):
            return NetState(s.seen + 1, s.total + e.draw, s.notes, e.src)
        assert isinstance(e, NetNote)
        return NetState(s.seen, s.total, s.notes + 1, s.last_src)

    def handle(self, ctx: Context, msg: Message) -> None:
        if not isinstance(msg, NetPing | NetTick):
            ctx.record(NetNote(what=type(msg).__name__))  # pongs, AskFailed, ChildFailed
            return
        p_timer, p_spawn, p_stop, p_fail, p_ask = self.p
        rng = ctx.rng
        draw = rng.random()
        ctx.record(NetSeen(tag=msg.tag, draw=draw, src=ctx.sender))
        if draw < p_fail:
            raise RuntimeError(f"scripted failure on tag {msg.tag}")
        assert ctx.env is not None
        if isinstance(msg, NetPing) and ctx.env.ask:
            ctx.reply(NetPong(tag=msg.tag))
        hops = msg.hops if isinstance(msg, NetPing) else 1
        if hops <= 0:
            return
        for _ in range(rng.randint(0, self.fanout)):
            dst = rng.choice(self.peers)
            if rng.random() < p_ask:
                ctx.ask(dst, NetPing(hops=hops - 1, tag=msg.tag), timeout_s=rng.uniform(0.1, 3.0))
            else:
                ctx.send(dst, NetPing(hops=hops - 1, tag=msg.tag))
        if rng.random() < p_timer:
            ctx.after(rng.uniform(0.0, 2.0), NetTick(tag=msg.tag), key=rng.choice(["a", "b", None]))
        if self.depth < 2 and rng.random() < p_spawn:
            child = f"{ctx.self}/c{ctx.seq}"
            cls = rng.choice(NODE_CLASSES)
            ctx.spawn(child, cls, peers=[ctx.self, *self.peers[:3]], depth=self.depth + 1)
            ctx.send(child, NetPing(hops=hops - 1, tag=msg.tag))
        if rng.random() < p_stop:
            ctx.stop(rng.choice([*self.peers, ctx.self]))


class NetNodeStop(NetNode):
    supervision: ClassVar[Supervision] = Supervision(directive=Directive.STOP)


class NetNodeEscalate(NetNode):
    supervision: ClassVar[Supervision] = Supervision(directive=Directive.ESCALATE)


NODE_CLASSES: list[type[NetNode]] = [NetNode, NetNodeStop, NetNodeEscalate]


class Network(msgspec.Struct):
    """A network and its external input schedule, as plain data."""

    nodes: list[tuple[int, dict[str, Any]]]  # (class index, constructor args)
    inputs: list[tuple[float, int, int, int, bool]]  # (t, node, hops, tag, ask)
    respawns: list[tuple[float, int]]  # (t, node): an external Started at time t


def random_network(rnd: random.Random, n: int) -> Network:
    addrs = [f"n/{i}" for i in range(n)]
    nodes = []
    for _ in range(n):
        args = {
            "peers": rnd.sample(addrs, rnd.randint(1, min(4, n))),
            "fanout": rnd.randint(1, 3),
            "p_timer": rnd.choice([0.0, 0.2, 0.5]),
            "p_spawn": rnd.choice([0.0, 0.05, 0.2]),
            "p_stop": rnd.choice([0.0, 0.02, 0.1]),
            "p_fail": rnd.choice([0.0, 0.05, 0.3]),
            "p_ask": rnd.choice([0.0, 0.1, 0.5]),
        }
        nodes.append((rnd.randrange(len(NODE_CLASSES)), args))
    inputs = [
        (round(rnd.uniform(0, 10), 3), rnd.randrange(n), rnd.randint(0, 4), k, rnd.random() < 0.2)
        for k in range(rnd.randint(1, 30))
    ]
    respawns = [(round(rnd.uniform(0, 10), 3), rnd.randrange(n)) for _ in range(rnd.randint(0, 3))]
    return Network(nodes, inputs, respawns)


def run_network(net: Network, seed: int, sink: LogSink | None, budget: int = 20_000) -> SimDriver:
    driver = SimDriver(seed, sink=sink, config={"test": "netactors"})
    for i, (kind, args) in enumerate(net.nodes):
        driver.spawn(f"n/{i}", NODE_CLASSES[kind], **args)
    for t, node, hops, tag, ask in net.inputs:
        driver.inject(f"n/{node}", NetPing(hops=hops, tag=tag), at=t, corr=f"in-{tag}", ask=ask)
    for t, node in net.respawns:
        kind, args = net.nodes[node]
        started = Started(cls=class_path(NODE_CLASSES[kind]), args=args)
        driver.inject(f"n/{node}", started, at=t, src="ext/operator")
    driver.run(max_deliveries=budget)
    return driver


def write_log(path: str, seed: int, net_seed: int, n: int = 30) -> None:
    """Run one network into a log file (for cross-process tests, run through
    `python -c "import netactors; ..."` so classes are named `netactors:…`)."""
    from deepserve.persistence import open_sink

    sink = open_sink(path, "async")
    run_network(random_network(random.Random(net_seed), n), seed, sink)
    sink.close()
