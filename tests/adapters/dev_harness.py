"""Shared by the device tests: a driver with the devices spawned, answer collection, a client
actor that asks with a timeout, and log helpers."""

from __future__ import annotations

from functools import reduce
from typing import Any

from deepserve.actors.ports.npu import NpuForward, NpuProbe
from deepserve.adapters.hardware.devices.topology import Topology, spawn_topology
from deepserve.core import (
    Actor,
    AskFailed,
    Context,
    Event,
    MemorySink,
    Message,
    SimDriver,
    decode,
    encode,
)

TEST_SRC = "ext/test"


class DevAsk(Message, frozen=True):
    """Tell the client to ask `dst` with `msg`, giving up after `timeout_s`."""

    dst: str
    msg: NpuForward | NpuProbe  # concrete types: a logged message must decode on replay
    timeout_s: float


class DevClientGot(Event, frozen=True):
    kind: str  # the answer's type name, or "AskFailed"
    req_id: str
    at_s: float
    detail: str = ""


class DevClientLog(Actor[tuple]):
    """Records every answer it receives (or its ask's failure) as an event."""

    def initial_state(self) -> tuple:
        return ()

    def evolve(self, state: tuple, event: Event) -> tuple:
        assert isinstance(event, DevClientGot)
        return (*state, event)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, DevAsk):
            ctx.ask(msg.dst, msg.msg, msg.timeout_s)
        elif isinstance(msg, AskFailed):
            ctx.record(DevClientGot("AskFailed", str(msg.request_id), ctx.now(), msg.reason))
        else:
            req_id = getattr(msg, "req_id", "")
            ctx.record(DevClientGot(type(msg).__name__, req_id, ctx.now()))


def make_driver(
    topo: Topology | None = None, *, seed: int = 0, variance: bool = False
) -> SimDriver:
    d = SimDriver(seed=seed, sink=MemorySink())
    if topo is not None:
        spawn_topology(d, topo, variance=variance)
    return d


def send(d: SimDriver, dst: str, msg: Message, at: float | None = None) -> None:
    d.inject(dst, msg, at=at, src=TEST_SRC)


def answers(d: SimDriver) -> list[tuple[float, Any]]:
    """(time, message) of everything the devices sent to the test."""
    return [(t, env.msg) for t, env in d.external_out if env.dst == TEST_SRC]


def answer_for(d: SimDriver, req_id: str) -> tuple[float, Any]:
    found = [(t, m) for t, m in answers(d) if getattr(m, "req_id", None) == req_id]
    assert len(found) == 1, f"expected exactly one answer for {req_id!r}, got {found}"
    return found[0]


def events(d: SimDriver, actor: str) -> list[Any]:
    sink = d.sink
    assert isinstance(sink, MemorySink)
    return [
        decode(e.type, e.payload) for s in sink.steps if s.input.actor == actor for e in s.events
    ]


def handler_failures(d: SimDriver) -> list[Any]:
    sink = d.sink
    assert isinstance(sink, MemorySink)
    return [
        decode(e.type, e.payload) for s in sink.steps for e in s.events if e.type == "HandlerFailed"
    ]


def assert_state_is_fold(d: SimDriver, addr: str) -> None:
    """The actor's state equals the fold of its recorded domain events."""
    actor = d.actor(addr)
    domain = [e for e in events(d, addr) if not e.system]
    assert reduce(actor.evolve, domain, actor.initial_state()) == actor.state


def log_encoding(d: SimDriver) -> list[tuple[bytes, bytes, bytes]]:
    """The whole log as (input, events, outputs) encodings: wall-clock free in SimDriver."""
    sink = d.sink
    assert isinstance(sink, MemorySink)
    return [(encode(s.input), encode(s.events), encode(s.outputs)) for s in sink.steps]
