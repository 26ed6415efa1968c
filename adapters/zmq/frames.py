"""What travels on the sockets: msgpack frames.

A data frame (DEALER -> ROUTER) carries a batch of encoded envelopes with the
sender's identity and sequence numbers; an ack frame (ROUTER -> DEALER) says how
far the receiver has delivered, and whether it saw a gap (resend from there).

    data: [sender_id, base, first_seq, want_ack, [Wire, ...]]
    ack:  [delivered_upto, gap]

`base` is the sender's lowest unacknowledged sequence number: a receiver that has
never heard of this sender (it just restarted) starts there, so a frame lost with
the old connection is noticed as a gap rather than skipped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from deepserve.core.transport import Wire

# Socket options and flags as plain ints: pyzmq's enum members cost ~0.8 µs a call
# in `getsockopt` (an enum conversion), several times per message on the hot path.
EVENTS, POLLIN, NOBLOCK, RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK), int(zmq.RCVMORE)

# pyzmq's C-level socket methods, called as functions on the hot path: `zmq.Socket`'s own
# `send` is a Python wrapper (keyword arguments into the C one), and any attribute read on a
# `zmq.Socket` goes through its `__getattr__` hook first (cachegrind: ~3k instructions a
# message on each side between them).
sock_send = zmq.backend.Socket.send
sock_recv = zmq.backend.Socket.recv
# (typed as returning Any: the option decides the type, and every option read here is an int)
sock_get: Callable[[zmq.Socket, int], Any] = zmq.backend.Socket.get


class DataIn(msgspec.Struct, array_like=True):
    sender: int
    base: int
    first: int
    want_ack: bool
    items: list[Wire]


class Ack(msgspec.Struct, array_like=True):
    upto: int
    gap: bool


_enc = msgspec.msgpack.Encoder()
# core.transport's encoder of a `Wire`
encode_wire = msgspec.msgpack.Encoder(order="deterministic").encode
_data_dec = msgspec.msgpack.Decoder(DataIn)
_ack_dec = msgspec.msgpack.Decoder(Ack)
_Raw = msgspec.Raw
# The C methods behind `data_frame`, `read_data` and the `Wire` encoding, for the compiled modules
# to call without a Python function around them.
encode_frame = _enc.encode
decode_data = _data_dec.decode


def data_frame(sender: int, base: int, first: int, want_ack: bool, items: list[bytes]) -> bytes:
    """Items are already-encoded `Wire`s (encoded once, at send time)."""
    return _enc.encode((sender, base, first, want_ack, list(map(_Raw, items))))


def read_data(frame: bytes) -> DataIn:
    return _data_dec.decode(frame)


def ack_frame(upto: int, gap: bool = False) -> bytes:
    return _enc.encode((upto, gap))


def read_ack(frame: bytes) -> Ack:
    return _ack_dec.decode(frame)


def receive_and_ack(router: Any) -> list[Wire]:
    """For a plain ZeroMQ ROUTER standing in for a node (tests, tools): take one data
    frame, acknowledge it, return its envelopes (duplicates of a resend included)."""
    ident, frame = router.recv_multipart()
    data = read_data(frame)
    router.send_multipart([ident, ack_frame(data.first + len(data.items) - 1)])
    return data.items

