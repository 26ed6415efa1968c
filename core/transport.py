"""How envelopes leave a driver for another one: the `Transport` protocol and the
in-process implementation. The ZeroMQ transport (adapters/zmq_transport.py)
implements the same protocol across OS processes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from .codec import decode, encode
from .envelope import Envelope

Deliver = Callable[[Envelope], None]


class Transport(Protocol):
    def owns(self, addr: str) -> bool:
        """True if `addr` lives behind this transport (on another node)."""
        ...

    def send(self, env: Envelope) -> bool:
        """Hand an envelope to the node owning `env.dst`; False if nobody does."""
        ...

    def attach(self, deliver: Deliver) -> None:
        """Register the local driver's entry point for envelopes arriving here."""
        ...

    def close(self) -> None: ...


def longest_prefix(routes: dict[str, Any], addr: str) -> Any | None:
    """Route table lookup by whole path segments: ``{"te/": node}`` and ``{"te/3": node}``
    match ``te/3/dp/1``; ``hw/s0/npu1`` matches itself and ``hw/s0/npu1/...`` but not
    ``hw/s0/npu10`` (an address is a route to that actor and its children, never to a
    sibling whose name it happens to start)."""
    best, best_len = None, -1
    n = len(addr)
    for prefix, target in routes.items():
        k = len(prefix)
        if k > best_len and addr.startswith(prefix) and (k == n or prefix[-1] == "/" or addr[k] == "/"):
            best, best_len = target, k
    return best


class InProcHub:
    """Connects several drivers in one process; each registers address prefixes."""

    def __init__(self) -> None:
        self.routes: dict[str, Deliver] = {}

    def transport(self, prefixes: list[str]) -> InProcTransport:
        return InProcTransport(self, prefixes)


class InProcTransport:
    def __init__(self, hub: InProcHub, prefixes: list[str]) -> None:
        self.hub = hub
        self.prefixes = prefixes

    def owns(self, addr: str) -> bool:
        deliver = longest_prefix(self.hub.routes, addr)
        return deliver is not None and not any(addr.startswith(p) for p in self.prefixes)

    def send(self, env: Envelope) -> bool:
        deliver = longest_prefix(self.hub.routes, env.dst)
        if deliver is None:
            return False
        # Copy through the codec: the receiver must never share objects with the sender.
        deliver(wire_decode(wire_encode(env)))
        return True

    def attach(self, deliver: Deliver) -> None:
        for p in self.prefixes:
            self.hub.routes[p] = deliver

    def close(self) -> None:
        for p in self.prefixes:
            self.hub.routes.pop(p, None)


class Wire(msgspec.Struct, array_like=True):
    src: str
    dst: str
    msg_id: int
    hlc: int
    corr: str | None
    reply_to: int | None
    ask: bool
    external: bool
    type: str
    payload: bytes


_wire_enc = msgspec.msgpack.Encoder(order="deterministic")
_wire_dec = msgspec.msgpack.Decoder(Wire)


def wire_encode(env: Envelope) -> bytes:
    payload = env.payload if env.payload is not None else encode(env.msg)
    w = Wire(env.src, env.dst, env.msg_id, env.hlc, env.corr, env.reply_to, env.ask,
             env.external, type(env.msg).__name__, payload)
    return _wire_enc.encode(w)


def wire_decode(data: bytes) -> Envelope:
    w = _wire_dec.decode(data)
    msg = decode(w.type, w.payload)
    return Envelope(w.src, w.dst, w.msg_id, w.hlc, w.corr, msg, w.reply_to, w.ask, w.external, w.payload)
