"""The sending half: one DEALER per peer endpoint, a window of unacknowledged
envelopes, resend on a gap or a silent peer.

Envelopes are encoded at `push` (the receiver never shares objects with the sender)
and kept until the peer acknowledges them: `queued` (not yet on the wire) then
`inflight` (sent, not acknowledged). A frame lost with a broken connection (the
peer restarted) is resent from the first unacknowledged one; the receiver drops
the duplicates by sequence number (go-back-N). ZeroMQ reconnects the DEALER."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Final

import msgspec
import zmq

from . import frames
from .frames import read_ack
from .limits import Limits

# Module-level `Final`s are C statics in the compiled build (compiled.py), not dict lookups.
_EVENTS: Final = frames.EVENTS
_POLLIN: Final = frames.POLLIN
_NOBLOCK: Final = frames.NOBLOCK
_sock_send: Final = frames.sock_send
_sock_get: Final = frames.sock_get
_encode_frame: Final = frames.encode_frame
_Raw: Final = msgspec.Raw


class Peer:
    """Everything this node has accepted for one endpoint and not yet seen acknowledged."""

    def __init__(self, endpoint: str, ctx: zmq.Context, sender_id: int, limits: Limits,
                 loop: asyncio.AbstractEventLoop) -> None:  # fmt: skip
        self.endpoint = endpoint
        self.limits = limits
        # (read on every send: plain attributes, not the Struct's, which compiled code reaches
        # by name)
        self.window = limits.window
        self.high_water = limits.high_water
        self.sender_id = sender_id
        self.loop = loop
        self.sock = sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)  # nothing is lost at close: the acks say so
        sock.setsockopt(zmq.SNDHWM, limits.window + 16)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.connect(endpoint)
        # ZeroMQ's FD signals "events may have changed" (edge-like): read until Again,
        # and look at EVENTS again after every send on the socket.
        self.fd = sock.getsockopt(zmq.FD)
        loop.add_reader(self.fd, self.read_acks)
        self._timer = loop.call_later(limits.resend_s, self._tick)
        self._seen = 0
        self.queued: deque[bytes] = deque()
        self.inflight: deque[bytes] = deque()
        self.acked = 0  # every sequence number <= acked is delivered
        # Past `high_water` senders wait on `room`; `full` mirrors it as a plain bool, read on
        # every send (an Event's methods are Python calls, a few per message otherwise).
        self.room = asyncio.Event()
        self.room.set()
        self.full = False
        self._drained: asyncio.Future[None] | None = None  # `wait_drained`'s, made only then
        self.scheduled = False
        self.closing = False
        self.last_progress = time.monotonic()
        self._rewound_at = -1
        self.resent = 0

    def pending(self) -> int:
        return len(self.queued) + len(self.inflight)

    def stalled(self) -> bool:
        """Acks stopped for `peer_timeout_s` with envelopes outstanding: gone or hung."""
        return bool(self.inflight) and time.monotonic() - self.last_progress > self.limits.peer_timeout_s

    def push(self, wire: bytes) -> bool:
        """Queue `wire`. True when this opened a turn's batch: the caller then arranges
        `flush` once the turn's sends are done (at the end of the receive callback that sent,
        else on the next turn of the loop; `ZmqTransport.send`)."""
        queued, inflight = self.queued, self.inflight
        if not queued and not inflight:
            self.last_progress = time.monotonic()
        queued.append(wire)
        if not self.full and len(queued) + len(inflight) >= self.high_water:
            self.full = True
            self.room.clear()
        if self.scheduled:
            return False
        # Everything sent during this turn leaves in one batch, but the first envelope to
        # an idle peer leaves at once: a request/reply (a round trip) does not wait for a
        # turn of the loop on either side.
        self.scheduled = True
        if len(queued) == 1 and len(inflight) < self.window:
            self._send_batch(False)
        return True

    def flush(self, want_ack: bool = False) -> None:
        self.scheduled = False
        queued, inflight, window = self.queued, self.inflight, self.window
        sent = False
        while queued and len(inflight) < window:
            if not self._send_batch(want_ack):
                break
            sent = True
        # A send may have taken the FD's signal of an ack already waiting: look (EVENTS, ~3 µs
        # in pyzmq) when this flush sent, when an ack is wanted, or past half the window. An
        # envelope that left at once (`push`) and nothing after it in the turn (a round trip)
        # does not: its acks come on the receiver's delay, the next one's signal or the resend
        # timer (which reads acks before it resends) picks up one that waits.
        if sent or want_ack or self.closing or len(inflight) >= window // 2:
            if _sock_get(self.sock, _EVENTS) & _POLLIN:
                self.loop.call_soon(self.read_acks)

    def _send_batch(self, want_ack: bool) -> bool:
        """One data frame of what is queued (within the window); False if ZeroMQ
        refused it (the frame counts as in flight; the resend timer sends it again)."""
        queued, inflight, window = self.queued, self.inflight, self.window
        if len(queued) == 1:  # a round trip's (callers keep the window open)
            items = [queued.popleft()]
        else:
            items = [queued.popleft() for _ in range(min(len(queued), self.limits.batch, window - len(inflight)))]
        first = self.acked + len(inflight) + 1
        inflight.extend(items)
        want = want_ack or self.closing or len(inflight) >= window // 2
        # (frames.data_frame, inlined)
        frame = _encode_frame((self.sender_id, self.acked + 1, first, want, [_Raw(w) for w in items]))
        try:
            _sock_send(self.sock, frame, _NOBLOCK)
        except zmq.Again:
            return False
        return True

    def on_ack(self, upto: int, gap: bool) -> None:
        inflight = self.inflight
        if upto > self.acked:
            for _ in range(min(upto - self.acked, len(inflight))):
                inflight.popleft()
            self.acked = upto
            self.last_progress = time.monotonic()
        if gap and self._rewound_at != self.acked:
            self._rewound_at = self.acked  # once per gap, not once per frame behind it
            self.rewind()
        pending = len(self.queued) + len(inflight)
        if self.full and pending <= self.high_water // 2:
            self.full = False
            self.room.set()
        if not pending:
            self._wake_drained()
        elif self.queued and not self.scheduled:
            self.flush()

    async def wait_drained(self) -> None:
        """Until nothing is pending (every envelope acknowledged)."""
        while self.pending():
            if self._drained is None:
                self._drained = self.loop.create_future()
            await self._drained

    def _wake_drained(self) -> None:
        waiter, self._drained = self._drained, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def rewind(self) -> None:
        """Send everything unacknowledged again, oldest first."""
        if self.inflight:
            self.resent += len(self.inflight)
            self.queued.extendleft(reversed(self.inflight))
            self.inflight.clear()
        self.flush(want_ack=True)

    def read_acks(self) -> None:
        sock = self.sock
        if sock.closed:
            return
        while True:
            try:
                frame = sock.recv(_NOBLOCK)
            except zmq.Again:
                return
            ack = read_ack(frame)
            self.on_ack(ack.upto, ack.gap)

    def _tick(self) -> None:
        """Every `resend_s`: a peer silent with envelopes outstanding gets them again."""
        self._timer = self.loop.call_later(self.limits.resend_s, self._tick)
        if self.inflight and self.acked == self._seen:
            self.read_acks()  # an ack may be waiting unsignalled (see flush)
        if self.inflight and self.acked == self._seen:
            self._rewound_at = -1
            self.rewind()
        elif self.queued and not self.scheduled:
            self.flush()
        self._seen = self.acked

    def close(self) -> None:
        self._timer.cancel()
        if not self.loop.is_closed():
            # (through Any: asyncio's stubs say `remove_reader` returns a bool, uvloop's returns
            # None, and compiled code checks a declared return type even when it is unused)
            loop: Any = self.loop
            loop.remove_reader(self.fd)
        self.sock.close(linger=0)
