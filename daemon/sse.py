"""The completion routes' SSE response: Starlette's `StreamingResponse` (its readable version,
kept as the reference: tests/daemon/test_sse.py checks they send the same messages), without the
anyio task group it opens per response, and with its body chunks written straight to uvicorn's
connection (`ChunkSink`).

On an ASGI server older than spec 2.4 (uvicorn says 2.3) `StreamingResponse` runs the stream in a
task of a new anyio task group and listens for the client's disconnect in the caller, under
anyio cancel scopes: per request a task group, a cancel scope per task, a task handle and an
anyio event (~4 % of the daemon's CPU under `bench http`'s load, py-spy). Here the stream runs in
the caller's task, and a plain asyncio task awaits the disconnect and cancels the caller's task
if it comes first; the cancellation is then taken back (`Task.uncancel`), so the response ends as
`StreamingResponse`'s does when its cancel scope cancels the stream: normally, its generator
closed at the await where it stood.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import h11
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import RequestResponseCycle


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has gone away (StreamingResponse.listen_for_disconnect's loop)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def chunked(chunk: bytes) -> bytes:
    """A body chunk in HTTP/1.1 chunked framing (h11's ChunkedWriter: size, data, CRLF)."""
    return b"%x\r\n%b\r\n" % (len(chunk), chunk)


_CYCLE_NEEDS = ("conn", "transport", "flow", "disconnected", "response_complete")


class ChunkSink:
    """The body chunks of a streamed response, written to uvicorn's h11 connection as uvicorn's
    `RequestResponseCycle.send` writes them (the readable version: tests/daemon/test_sse_wire.py
    compares the bytes on the wire both ways), without what a chunk costs there: the ASGI message
    dict, the send coroutine, h11's state machine (a body chunk changes no state) and its writer's
    three pieces joined (py-spy under `bench http`'s load: `send` was 13 % of the event loop's busy
    samples, half of it the socket write, which stays; here the write is nearly all a chunk costs).
    Only past a first chunk that h11 itself framed as `chunked` does: an HTTP/1.0 client (no
    chunking) keeps h11's framing, chunk by chunk."""

    __slots__ = ("cycle", "framed")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle
        self.framed = False  # h11 framed a chunk as `chunked` does: write them here from now on

    @staticmethod
    def of(send: Send) -> ChunkSink | None:
        """The sink of uvicorn's h11 cycle whose `send` this is (None: another server)."""
        cycle = getattr(send, "__self__", None)  # (a HEAD response has no body to write)
        if type(cycle) is not RequestResponseCycle or cycle.scope["method"] == "HEAD":
            return None
        # uvicorn's internals, not its API: a uvicorn without them keeps its own send
        return ChunkSink(cycle) if all(hasattr(cycle, a) for a in _CYCLE_NEEDS) else None

    def paused(self) -> bool:
        """Whether the client reads too slowly for another chunk now (await `drain` first)."""
        cycle = self.cycle
        return cycle.flow.write_paused and not cycle.disconnected

    async def drain(self) -> None:
        await self.cycle.flow.drain()

    def write(self, chunk: bytes) -> None:
        """`send({"type": "http.response.body", "body": chunk, "more_body": True})`, once not
        `paused` (as uvicorn's send waits for the transport first)."""
        cycle = self.cycle
        if cycle.disconnected or not chunk:  # gone: dropped, as uvicorn drops it; empty: no bytes
            return
        if cycle.response_complete:  # as uvicorn's send refuses it
            raise RuntimeError("Unexpected ASGI message 'http.response.body' sent, after response already completed.")
        if self.framed:
            cycle.transport.write(chunked(chunk))
            return
        out = cycle.conn.send(event=h11.Data(data=chunk))
        self.framed = out == chunked(chunk)
        cycle.transport.write(out)


class SseResponse(StreamingResponse):
    """`StreamingResponse` (same headers, same body messages, same disconnect handling) with the
    stream in the caller's task and the disconnect watched by one asyncio task."""

    @classmethod
    def events(cls, body: AsyncIterator[bytes], request_id: str) -> SseResponse:
        """`SseResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache",
        "X-Request-Id": request_id})` (the readable version: tests/daemon/test_sse.py checks they
        are alike), its headers as `init_headers` makes them without their making (lowercasing
        and encoding each, an ABC check of `body`): ~0.5 % of the daemon's CPU (py-spy)."""
        response = cls.__new__(cls)
        response.body_iterator, response.status_code, response.background = body, 200, None
        response.media_type = "text/event-stream"
        response.raw_headers = [(b"cache-control", b"no-cache"), (b"x-request-id", request_id.encode("latin-1")),
                                (b"content-type", b"text/event-stream; charset=utf-8")]  # fmt: skip
        return response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # not the completion routes' case: the reference path
            await super().__call__(scope, receive, send)
            return
        loop = asyncio.get_running_loop()  # once: each lookup reads the pid (a syscall)
        task = asyncio.current_task(loop)
        assert task is not None
        gone: list[bool] = []
        streaming = [True]

        def on_disconnect(watch: asyncio.Future[Any]) -> None:
            # a callback scheduled just before the stream ended must not cancel what follows it
            if streaming and not watch.cancelled() and watch.exception() is None:
                gone.append(True)
                task.cancel()

        watch = loop.create_task(_disconnect(receive))  # (ensure_future's, for a coroutine)
        watch.add_done_callback(on_disconnect)
        try:
            await self._stream(send)
        except asyncio.CancelledError:
            if not gone:  # cancelled from outside (shutdown): not ours to take back
                raise
            task.uncancel()
        finally:
            streaming.clear()
            watch.cancel()
        if self.background is not None:
            await self.background()

    async def _stream(self, send: Send) -> None:
        """`stream_response` (its readable version), each body chunk through `ChunkSink` where
        the server is uvicorn's h11 one."""
        sink = ChunkSink.of(send)
        if sink is None:
            await self.stream_response(send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        write, flow = sink.write, sink.cycle.flow
        async for chunk in self.body_iterator:
            if flow.write_paused and sink.paused():
                await sink.drain()
            write(chunk if isinstance(chunk, (bytes, memoryview)) else chunk.encode(self.charset))
        await send({"type": "http.response.body", "body": b"", "more_body": False})
