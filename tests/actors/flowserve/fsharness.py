"""Shared by the FlowServe tests: drivers with a MemorySink, answer collection, replay verify."""

from __future__ import annotations

from typing import Any

from deepserve.core import MemorySink, SimDriver, decode
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

TEST_SRC = "ext/test"


def driver(seed: int = 0) -> SimDriver:
    return SimDriver(seed=seed, sink=MemorySink())


def out_to(d: SimDriver, dst: str = TEST_SRC) -> list[tuple[float, Any]]:
    """(time, message) of everything actors sent to `dst` (an ext/ address)."""
    return [(t, env.msg) for t, env in d.external_out if env.dst == dst]


def events_of(d: SimDriver, actor: str, type_name: str | None = None) -> list[Any]:
    sink = d.sink
    assert isinstance(sink, MemorySink)
    return [
        decode(e.type, e.payload)
        for s in sink.steps
        if s.input.actor == actor
        for e in s.events
        if type_name is None or e.type == type_name
    ]


def failures(d: SimDriver) -> list[Any]:
    sink = d.sink
    assert isinstance(sink, MemorySink)
    return [decode(e.type, e.payload) for s in sink.steps for e in s.events if e.type == "HandlerFailed"]


def assert_replays(d: SimDriver) -> None:
    """Exact re-execution of the whole log says identical, and no handler failed."""
    assert failures(d) == []
    result = verify(MemoryLog(d.sink))
    assert result.identical, result.divergence
