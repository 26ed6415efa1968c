"""ZeroMQ transport: envelopes between OS processes (PUSH to peers, PULL here).

Each process binds one PULL socket; a route table maps address prefixes to peer
endpoints. Receiving runs on a thread (blocking `recv` with a poll timeout) and
hands envelopes to the driver's event loop with `call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import threading

import zmq

from deepserve.core.envelope import Envelope
from deepserve.core.transport import Deliver, longest_prefix, wire_decode, wire_encode

POLL_MS = 50
SEND_HWM = 100_000


class ZmqTransport:
    def __init__(self, bind: str | None, routes: dict[str, str]) -> None:
        self.ctx = zmq.Context.instance()
        self.routes = dict(routes)
        self.bind = bind
        self._push: dict[str, zmq.Socket] = {}
        self._pull: zmq.Socket | None = None
        self.endpoint: str | None = None
        if bind is not None:
            # Bound now, so a "tcp://127.0.0.1:*" endpoint's port is known before any
            # peer's routes are written.
            self._pull = self.ctx.socket(zmq.PULL)
            self._pull.setsockopt(zmq.LINGER, 0)
            self._pull.bind(bind)
            self.endpoint = self._pull.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.sent = 0
        self.refused = 0

    def owns(self, addr: str) -> bool:
        return longest_prefix(self.routes, addr) is not None

    def _socket_for(self, endpoint: str) -> zmq.Socket:
        sock = self._push.get(endpoint)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(endpoint)
            self._push[endpoint] = sock
        return sock

    def send(self, env: Envelope) -> bool:
        endpoint = longest_prefix(self.routes, env.dst)
        if endpoint is None:
            return False
        try:
            self._socket_for(endpoint).send(wire_encode(env), zmq.NOBLOCK)
        except zmq.Again:
            self.refused += 1  # peer gone or far behind: the caller records the drop
            return False
        self.sent += 1
        return True

    def attach(self, deliver: Deliver) -> None:
        if self._pull is None:
            return
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(
            target=self._recv_loop, args=(loop, deliver), name="zmq-recv", daemon=True
        )
        self._thread.start()

    def _recv_loop(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        pull = self._pull
        assert pull is not None
        while not self._stop.is_set():
            if not pull.poll(POLL_MS):
                continue
            data = pull.recv()
            loop.call_soon_threadsafe(deliver, wire_decode(data))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        for sock in self._push.values():
            sock.close()
        if self._pull is not None:
            self._pull.close()
