"""A handler failure whose text holds a memory address verifies as identical.

`<object object at 0x7f…>` differs from process to process (and from run to replay):
verify and digest compare the exception type and text with addresses masked.
"""

from __future__ import annotations

from deepserve.core import Actor, Context, Message, SimDriver
from deepserve.core.records import MemorySink
from deepserve.persistence import MemoryLog
from deepserve.replay import digest, verify

# Every object the handler names stays alive, so no two failures share an address.
KEPT: list[object] = []


class Poke(Message, frozen=True):
    n: int


class AddressInError(Actor[None]):
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Poke) and msg.n % 2:
            thing = object()
            KEPT.append(thing)
            raise ValueError(f"cannot use {thing!r} for poke {msg.n}")


def _run() -> MemorySink:
    sink = MemorySink()
    sim = SimDriver(seed=5, sink=sink)
    sim.spawn("a", AddressInError)
    for i in range(4):
        sim.inject("a", Poke(i), at=float(i))
    sim.run()
    return sink


def test_addresses_in_handler_errors_do_not_diverge() -> None:
    sink = _run()
    errors = [ev for s in sink.steps for ev in s.events if ev.type == "HandlerFailed"]
    assert len(errors) == 2 and b"object at 0x" in errors[0].payload
    result = verify(MemoryLog(sink))
    assert result.identical, result.divergence


def test_a_different_error_text_still_diverges(monkeypatch) -> None:
    sink = _run()
    monkeypatch.setattr(AddressInError, "handle", _other_error)
    result = verify(MemoryLog(sink))
    assert not result.identical
    assert result.divergence is not None and result.divergence.what == "event 0"


def _other_error(self: AddressInError, ctx: Context, msg: Message) -> None:
    if isinstance(msg, Poke) and msg.n % 2:
        raise ValueError(f"cannot use {object()!r} for poke number {msg.n}")


def test_digests_of_two_runs_agree_despite_addresses() -> None:
    assert digest(MemoryLog(_run())) == digest(MemoryLog(_run()))
