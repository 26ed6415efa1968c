"""`Limits` (the bounds of one ZeroMQ transport) and `TransportError`.

A module of their own, in pure Python: the transport's modules are compiled by mypyc
(compiled.py), which must not define a msgspec Struct (it would decode wrongly) and cannot
compile a subclass of `RuntimeError`."""

from __future__ import annotations

import msgspec


class Limits(msgspec.Struct, frozen=True):
    """Bounds of one transport; every queue has one."""

    window: int = 4096  # envelopes on the wire, unacknowledged, per peer
    high_water: int = 8192  # pending per peer above which senders wait
    max_pending: int = 65_536  # pending per peer above which a send is refused
    batch: int = 512  # envelopes per data frame
    resend_s: float = 0.25  # no ack progress for this long: resend the window
    ack_delay_s: float = 0.01  # a receiver acks at most this late unless asked at once (fewer sends)
    peer_timeout_s: float = 2.0  # no ack progress this long: senders stop waiting
    close_timeout_s: float = 5.0  # how long a close waits for the last acks

    def __post_init__(self) -> None:
        for name in ("window", "high_water", "max_pending", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if not self.window <= self.high_water <= self.max_pending:
            raise ValueError("Limits: need window <= high_water <= max_pending")
        for name in ("resend_s", "ack_delay_s", "peer_timeout_s", "close_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Limits.{name} must be > 0, got {getattr(self, name)}")


class TransportError(RuntimeError):
    """A socket that could not be bound, or a transport used after close."""
