"""SseResponse's body chunks written straight to uvicorn's connection (daemon/sse.py ChunkSink)
against its readable version, Starlette's StreamingResponse through uvicorn's `send`: on a real
uvicorn server and a real socket, the same bytes on the wire (HTTP/1.1 chunked, HTTP/1.0 without
chunking, a client reading slowly enough to pause the writes, keep-alive's second request on one
connection), and a client that goes away mid-stream closes the generator on both."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn
from starlette.responses import StreamingResponse

from deepserve.daemon.sse import ChunkSink, SseResponse, chunked

Body = Callable[[], AsyncIterator[bytes]]


def _app(cls: type[StreamingResponse], body: Body) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await cls(body(), media_type="text/event-stream", headers={"X-Request-Id": "r1"})(scope, receive, send)

    return app


async def _serve(app: Any, client: Callable[[int], Awaitable[Any]]) -> Any:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off",
                                           access_log=False))  # fmt: skip
    task = asyncio.ensure_future(server.serve())
    try:
        for _ in range(1000):
            if server.started:
                break
            await asyncio.sleep(0.01)
        return await asyncio.wait_for(client(server.servers[0].sockets[0].getsockname()[1]), 30)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def _request(version: str) -> bytes:
    return f"POST / HTTP/{version}\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode()


def _no_date(raw: bytes) -> bytes:
    return re.sub(rb"date: [^\r]*\r\n", b"", raw)


async def _exchange(port: int, version: str, requests: int = 1, slow: bool = False) -> bytes:
    """`requests` requests on one connection, each read to its end (the connection's close for
    HTTP/1.0); `slow`: nothing read for a while after the first request, so writes pause."""
    sock = socket.socket()
    if slow:  # a small receive buffer (no autotuning): the server's writes back up, whatever the host's
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)  # its reading pauses at 128 KiB
    out = b""
    try:
        for _ in range(requests):
            writer.write(_request(version))
            if slow:
                await asyncio.sleep(0.5)
            end = len(out)
            while not (data := await reader.read(1 << 16)) == b"":
                out += data
                if version == "1.1" and out.endswith(b"\r\n0\r\n\r\n") and len(out) - end > 5:
                    break
    finally:
        writer.close()
    return _no_date(out)


def _events(n: int, size: int = 0) -> Body:
    async def body() -> AsyncIterator[bytes]:
        for i in range(n):
            yield f"data: {i} {'x' * size}\n\n".encode()
            await asyncio.sleep(0)

    return body


@pytest.mark.parametrize(("version", "requests", "size", "slow"),
                         [("1.1", 1, 0, False), ("1.1", 2, 0, False), ("1.0", 1, 0, False), ("1.1", 1, 65536, True)])  # fmt: skip
def test_the_same_bytes_on_the_wire(version: str, requests: int, size: int, slow: bool,
                                    monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    n = 100 if slow else 17
    drains: list[bool] = []
    drain = ChunkSink.drain

    async def counted(sink: ChunkSink) -> None:
        drains.append(True)
        await drain(sink)

    monkeypatch.setattr(ChunkSink, "drain", counted)

    def run(cls: type[StreamingResponse]) -> bytes:
        return asyncio.run(_serve(_app(cls, _events(n, size)), lambda p: _exchange(p, version, requests, slow)))

    fast, readable = run(SseResponse), run(StreamingResponse)
    assert fast == readable
    assert fast.count(b"data: ") == n * requests
    assert (b"transfer-encoding: chunked" in fast.lower()) == (version == "1.1")
    assert bool(drains) == slow  # the slow client paused the writes


def test_a_client_that_goes_away_closes_the_stream() -> None:
    def run(cls: type[StreamingResponse]) -> list[str]:
        seen: list[str] = []

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b"data: 0\n\n"
                await asyncio.Event().wait()  # no second token: the client leaves first
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("closed")

        async def client(port: int) -> list[str]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request("1.1"))
            await reader.readuntil(b"data: 0\n\n\r\n")
            writer.close()
            for _ in range(1000):
                if "closed" in seen:
                    break
                await asyncio.sleep(0.01)
            return seen

        return asyncio.run(_serve(_app(cls, body), client))

    assert run(SseResponse) == run(StreamingResponse) == ["cancelled", "closed"]


def test_chunked_is_h11s_framing() -> None:
    import h11

    for data in (b"x", b"data: {}\n\n" * 300):
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(_request("1.1"))
        while not isinstance(conn.next_event(), h11.EndOfMessage):
            pass
        conn.send(h11.Response(status_code=200, headers=[]))
        assert conn.send(h11.Data(data=data)) == chunked(data)
    assert ChunkSink.of(lambda _m: None) is None  # another server's send: the readable path


def test_a_uvicorn_without_the_cycle_fields_it_writes_through_keeps_its_own_send(monkeypatch: pytest.MonkeyPatch) -> None:
    from deepserve.daemon import sse

    sinks: list[ChunkSink | None] = []
    of = ChunkSink.of
    monkeypatch.setattr(ChunkSink, "of", staticmethod(lambda send: sinks.append(of(send)) or sinks[-1]))
    run = lambda: asyncio.run(_serve(_app(SseResponse, _events(3)), lambda p: _exchange(p, "1.1")))  # noqa: E731
    written = run()
    monkeypatch.setattr(sse, "_CYCLE_NEEDS", (*sse._CYCLE_NEEDS, "a_field_uvicorn_renamed"))
    assert run() == written and written.count(b"data: ") == 3
    assert [s is None for s in sinks] == [False, True]
