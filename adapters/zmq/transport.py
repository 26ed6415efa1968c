"""`ZmqTransport`: core's `Transport` between OS processes over ZeroMQ.

Each node binds one ROUTER (its inbox) and connects one DEALER per peer endpoint
(`peer.py`); a `Directory` maps address prefixes to endpoints. Everything runs on
the event loop: a task awaits readiness only when a socket is empty, then drains it
with NOBLOCK calls (docs/decisions.md measures this against a receive thread).

Flow control, end to end: the receiver delivers a frame's envelopes into the
driver's mailboxes (waiting while a mailbox is past its high-water mark) before it
acknowledges them; a sender keeps at most `window` envelopes unacknowledged per
peer, queues up to `max_pending`, and tells the driver to wait (`congestion`) past
`high_water`. Past `max_pending` a send is refused, which the driver records as a
dead letter. `aclose` flushes and waits for the last acks; what is still
unacknowledged then is handed back to be recorded, never dropped in silence."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import structlog
import zmq

from deepserve.core.codec import decode, encode
from deepserve.core.envelope import Envelope
from deepserve.core.transport import Deliver, Wire, wire_decode

from . import frames
from .directory import Directory, EndpointError, check_endpoint
from .frames import RCVMORE, ack_frame
from .limits import Limits, TransportError
from .peer import Peer

log = structlog.get_logger("deepserve.zmq")
# Module-level `Final`s are C statics in the compiled build (compiled.py), not dict lookups.
_EVENTS: Final = frames.EVENTS
_POLLIN: Final = frames.POLLIN
_NOBLOCK: Final = frames.NOBLOCK
_sock_recv: Final = frames.sock_recv
_sock_get: Final = frames.sock_get
_read_data: Final = frames.decode_data
_encode_wire: Final = frames.encode_wire

# Admit an envelope: None once it is in a mailbox, or an awaitable that delivers it
# when the mailbox has room (the receiver stops reading its socket meanwhile).
Admit = Callable[[Envelope], Awaitable[None] | None]
DRAIN_FRAMES = 256  # frames read before letting other tasks run
MAX_SENDERS = 4096  # receiver-side sequence state kept per sending node
MAX_CACHE = 65_536  # resolved addresses remembered
ACK_LINGER_MS = 500  # at close: how long the last acks may take to leave


class _Sender:
    __slots__ = ("expected", "ident", "dirty")

    def __init__(self, expected: int) -> None:
        self.expected = expected  # next sequence number to deliver
        self.ident = b""
        self.dirty = False  # delivered since the last ack


class ZmqTransport:
    def __init__(self, bind: str | None = None, routes: dict[str, str] | Directory | None = None,
                 *, limits: Limits | None = None) -> None:  # fmt: skip
        self.directory = routes if isinstance(routes, Directory) else Directory(routes)
        self.limits = limits or Limits()
        self.sender_id = secrets.randbits(62)
        # Our own context, terminated at close: `Context.instance()` is shared state
        # that nobody terminates, so LINGER never applied (issue 7).
        self.ctx = zmq.Context()
        self.peers: dict[str, Peer] = {}
        self._cache: dict[str, Peer] = {}
        self._cache_version = -1
        self._senders: dict[int, _Sender] = {}
        self._admit: Admit | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # deliveries waiting for mailbox room
        self._reading = False  # the ROUTER's FD is registered with the loop
        self._paused = False  # a mailbox is full: the ROUTER is not read meanwhile
        self._ack_timer: asyncio.TimerHandle | None = None
        # While our receive callback runs: the peers that opened a batch in it, flushed
        # when it ends (one flush per callback instead of a loop callback per reply).
        self._turn: list[Peer] | None = None
        self._congested: Peer | None = None
        self._closed = False
        self.sent = self.refused = self.received = self.duplicates = 0
        self.malformed = 0  # frames received that were not our data frames
        self.endpoint: str | None = None
        self._router: zmq.Socket | None = None
        if bind is not None:
            self._bind(check_endpoint(bind, what="bind endpoint", bind=True))

    def _bind(self, bind: str) -> None:
        # Bound now, so a "tcp://127.0.0.1:*" endpoint's port is known before any
        # peer's directory is written.
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, 100_000)
        try:
            router.bind(bind)
        except zmq.ZMQError as exc:
            router.close(linger=0)
            self.ctx.destroy(linger=0)
            raise TransportError(f"cannot bind {bind}: {exc}") from None
        self._router = router
        self.endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def routes(self) -> Directory:
        """The directory (a mapping: `routes["b/"] = endpoint` updates it, checked)."""
        return self.directory

    # ---- Transport ----------------------------------------------------------------
    def owns(self, addr: str) -> bool:
        # The driver asks before every send: a peer already resolved for `addr` (the cache
        # `send` fills, cleared when the directory changes) answers without a prefix scan.
        if self._cache_version == self.directory.version and addr in self._cache:
            return True
        return self.directory.resolve(addr) is not None

    def send(self, env: Envelope) -> bool:
        """Accept `env` for its peer; False (refused) only past `max_pending` or after close."""
        # (the cache's fast path inlined: `_peer_for` on a miss or after a directory change)
        peer = self._cache.get(env.dst) if self._cache_version == self.directory.version else None
        if peer is None:
            peer = self._peer_for(env.dst)
        if peer is None or self._closed or len(peer.queued) + len(peer.inflight) >= self.limits.max_pending:
            self.refused += 1
            return False
        # (core.transport's `wire_encode`, here so that the compiled build runs it as C)
        payload = env.payload
        if payload is None:
            payload = encode(env.msg)
        wire = _encode_wire(Wire(env.src, env.dst, env.msg_id, env.hlc, env.corr, env.reply_to, env.ask,
                                 env.external, type(env.msg).__name__, payload))
        if peer.push(wire):
            turn = self._turn
            if turn is None:
                self._loop_now().call_soon(peer.flush)
            else:  # sent from our receive callback: flushed when it ends (`_drain`)
                turn.append(peer)
        self.sent += 1
        if peer.full:
            self._congested = peer
        return True

    def attach(self, deliver: Deliver) -> None:
        """Plain delivery (no waiting for mailbox space)."""
        def admit(env: Envelope) -> None:
            deliver(env)
        self.attach_admit(admit)

    def close(self) -> None:
        """Close at once; envelopes still unacknowledged are reported (use `aclose`)."""
        if self._closed:
            return
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._flush_acks()  # what we delivered is acknowledged before we go
        self._closed = True
        lost = sum(p.pending() for p in self.peers.values())
        if lost:
            log.warning("zmq transport closed with envelopes unacknowledged", count=lost,
                        peers=[p.endpoint for p in self.peers.values() if p.pending()])
        for task in list(self._tasks):
            task.cancel()
        for peer in self.peers.values():
            peer.close()
        if self._router is not None:
            self._stop_reading()
            self._router.close(linger=ACK_LINGER_MS)  # the last acks still leave
        self.ctx.term()

    # ---- flow control (used by AsyncDriver when present) ---------------------------------
    def attach_admit(self, admit: Admit) -> None:
        self._admit = admit
        self._loop_now()
        if self._router is not None:
            self._start_reading()

    def congestion(self) -> asyncio.Event | None:
        """After `send`: the room event of a peer the latest sends filled past its
        high-water mark (wait for it), or None. A stalled peer is not waited for:
        its sends queue up to `max_pending`, then are refused and recorded."""
        peer, self._congested = self._congested, None
        if peer is None or not peer.full or peer.stalled():
            return None
        return peer.room

    def unacknowledged(self) -> int:
        return sum(p.pending() for p in self.peers.values())

    async def aclose(self, timeout_s: float | None = None) -> list[Envelope]:
        """Flush every peer, wait for the acks, close; return what was never acknowledged."""
        if self._closed:
            return []
        wait_s = self.limits.close_timeout_s if timeout_s is None else timeout_s
        for peer in self.peers.values():
            peer.closing = True
            peer.flush(want_ack=True)
        try:
            async with asyncio.timeout(wait_s):
                for peer in self.peers.values():
                    await peer.wait_drained()
        except TimeoutError:
            pass
        left = [wire_decode(b) for p in self.peers.values() for b in (*p.inflight, *p.queued)]
        for p in self.peers.values():
            p.inflight.clear()
            p.queued.clear()
        self.close()
        return left

    # ---- sending -----------------------------------------------------------------------
    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _peer_for(self, addr: str) -> Peer | None:
        if self._cache_version != self.directory.version or len(self._cache) > MAX_CACHE:
            self._cache.clear()
            self._cache_version = self.directory.version
        peer = self._cache.get(addr)
        if peer is None:
            endpoint = self.directory.resolve(addr)
            if endpoint is None:
                return None
            peer = self.peers.get(endpoint)
            if peer is None:
                if self._closed:
                    return None
                peer = Peer(endpoint, self.ctx, self.sender_id, self.limits, self._loop_now())
                self.peers[endpoint] = peer
            self._cache[addr] = peer
        return peer

    # ---- receiving ---------------------------------------------------------------------
    def _start_reading(self) -> None:
        assert self._router is not None
        self._loop_now().add_reader(self._router.getsockopt(zmq.FD), self._drain)  # type: ignore[arg-type]
        self._reading = True
        self._loop_now().call_soon(self._drain)

    def _stop_reading(self) -> None:
        loop: Any = self._loop  # (Any: see `Peer.close`)
        if self._reading and self._router is not None and loop is not None and not loop.is_closed():
            loop.remove_reader(self._router.getsockopt(zmq.FD))
        self._reading = False

    def _drain(self) -> None:
        """The ROUTER may hold frames: read them until Again (or a budget, then yield).

        pyzmq's `getsockopt` costs ~2-3 µs a call here (it builds a `SocketOption` enum
        each time), a successful `recv` ~0.7 µs: so a drain receives first (it is woken
        because something arrived; a spurious wake costs one Again), reads no RCVMORE
        (our DEALERs send one frame; anything else fails to decode and its tail is
        dropped then), and asks EVENTS once a frame, to end the drain."""
        router = self._router
        if router is None or self._paused or self._closed:
            return
        turn: list[Peer] = []
        self._turn = turn
        try:
            self._drain_frames(router)
        finally:
            self._turn = None
            if not self._closed:
                for peer in turn:
                    peer.flush()

    def _drain_frames(self, router: zmq.Socket) -> None:
        for _ in range(DRAIN_FRAMES):
            try:
                ident = _sock_recv(router, _NOBLOCK)
                frame = _sock_recv(router, _NOBLOCK)  # our DEALERs send one frame: [ident, frame]
            except zmq.Again:
                return
            rest = self._on_frame(ident, frame)
            if rest is not None:  # a full mailbox: stop reading until it has room
                self._paused = True
                self._stop_reading()
                task: asyncio.Task[None] = self._loop_now().create_task(rest)  # type: ignore[arg-type]
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            if not _sock_get(router, _EVENTS) & _POLLIN:
                return
        self._loop_now().call_soon(self._drain)  # a flood: let the actors run

    def _foreign(self, frame: bytes, error: str) -> None:
        """Not one of our data frames (a stray client, a wrong port): counted, logged once
        per kind of error, its remaining parts dropped so the next read starts a message."""
        router = self._router
        assert router is not None
        while router.getsockopt(RCVMORE):
            router.recv(_NOBLOCK)
        self.malformed += 1
        if self.malformed == 1:
            log.warning("zmq transport dropped a frame it cannot read", bytes=len(frame), error=error)

    def _on_frame(self, ident: bytes, frame: bytes) -> Awaitable[None] | None:
        try:
            data = _read_data(frame)
        except msgspec.DecodeError as exc:
            self._foreign(frame, str(exc))
            return None
        st = self._senders.get(data.sender)
        if st is None:
            if len(self._senders) >= MAX_SENDERS:
                self._senders.pop(next(iter(self._senders)))
            st = self._senders[data.sender] = _Sender(data.base)
        st.ident = ident
        if data.base > st.expected:
            st.expected = data.base  # acknowledged to an earlier incarnation of this node
        if data.first > st.expected:  # a frame before this one was lost: resend from there
            self._send_ack(st, gap=True)
            return None
        skip = st.expected - data.first
        if skip:
            self.duplicates += min(skip, len(data.items))
        return self._deliver(st, data.items, skip, data.want_ack)

    def _deliver(self, st: _Sender, items: list[Wire], start: int, want_ack: bool) -> Awaitable[None] | None:
        admit = self._admit
        assert admit is not None
        for i in range(start, len(items)):
            waiting = admit(_envelope(items[i]))
            if waiting is not None:
                return self._resume(st, items, i, want_ack, waiting)
            st.expected += 1
            self.received += 1
        self._delivered(st, want_ack)
        return None

    def _delivered(self, st: _Sender, want_ack: bool) -> None:
        st.dirty = True
        if want_ack:
            self._send_ack(st)
        elif self._ack_timer is None:
            self._ack_timer = self._loop_now().call_later(self.limits.ack_delay_s, self._flush_acks)

    async def _resume(self, st: _Sender, items: list[Wire], i: int, want_ack: bool,
                      waiting: Awaitable[None]) -> None:  # fmt: skip
        """Finish a frame whose delivery waits for mailbox space, then read again."""
        admit = self._admit
        assert admit is not None
        while True:
            st.dirty = True
            self._flush_acks()  # what is in already is acknowledged meanwhile
            await waiting  # delivers items[i] (or records it as a full mailbox)
            st.expected += 1
            self.received += 1
            i += 1
            while i < len(items):
                nxt = admit(_envelope(items[i]))
                if nxt is not None:
                    waiting = nxt
                    break
                st.expected += 1
                self.received += 1
                i += 1
            else:
                break
        self._delivered(st, want_ack)
        self._paused = False
        if not self._closed:
            self._start_reading()

    def _send_ack(self, st: _Sender, gap: bool = False) -> None:
        st.dirty = False
        if self._router is None or self._closed:
            return
        try:
            self._router.send_multipart([st.ident, ack_frame(st.expected - 1, gap)], _NOBLOCK)
        except zmq.ZMQError:
            pass  # an ack lost is an ack resent: the sender's timer asks again

    def _flush_acks(self) -> None:
        self._ack_timer = None
        for st in self._senders.values():
            if st.dirty:
                self._send_ack(st)
        router = self._router
        if router is not None and not self._closed and _sock_get(router, _EVENTS) & _POLLIN:
            self._loop_now().call_soon(self._drain)  # the sends may have taken the FD's signal


def _envelope(w: Wire) -> Envelope:
    """A received `Wire` as the driver's envelope (core.transport's `wire_decode` after the
    frame's decoding, here so that the compiled build runs it as C)."""
    return Envelope(w.src, w.dst, w.msg_id, w.hlc, w.corr, decode(w.type, w.payload),
                    w.reply_to, w.ask, w.external, w.payload)


__all__ = ["Directory", "EndpointError", "Limits", "TransportError", "ZmqTransport"]
