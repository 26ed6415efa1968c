"""SseResponse (daemon/sse.py) against its readable version, Starlette's StreamingResponse: the
same ASGI messages for a whole stream, and for a client that goes away mid-stream the same end
(the generator closed where it stood, its `finally` run, the response returning normally)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

from deepserve.daemon.sse import SseResponse

SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "method": "POST"}


async def _serve(cls: type[StreamingResponse], disconnect_after: int | None) -> tuple[list[Any], list[str]]:
    """Serve a 5-chunk stream; with `disconnect_after`, the client leaves once that many body
    chunks were sent. Returns (messages sent, what the generator and the background saw)."""
    sent: list[Any] = []
    seen: list[str] = []
    gone = asyncio.Event()
    step = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        try:
            for i in range(5):
                yield f"data: {i}\n\n".encode()
                await step.wait()  # the next token: whenever the test says
                step.clear()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("closed")

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if disconnect_after is not None and len(sent) == 1 + disconnect_after:
            gone.set()
        else:
            step.set()

    resp = cls(body(), media_type="text/event-stream", headers={"X-Request-Id": "r1"},
               background=BackgroundTask(lambda: seen.append("background")))  # fmt: skip
    await asyncio.wait_for(resp(SCOPE, receive, send), 10)
    await asyncio.sleep(0)  # an asyncgen closed by GC would finalize here
    return [resp.raw_headers, *sent], seen


@pytest.mark.parametrize("disconnect_after", [None, 2])
def test_same_messages_and_end_as_streaming_response(disconnect_after: int | None) -> None:
    ref = asyncio.run(_serve(StreamingResponse, disconnect_after))
    fast = asyncio.run(_serve(SseResponse, disconnect_after))
    assert fast == ref
    if disconnect_after is None:
        assert ref[0][-1] == {"type": "http.response.body", "body": b"", "more_body": False}
        assert ref[1] == ["closed", "background"]
    else:  # cut after 2 chunks, the generator cancelled at its await, the response ended normally
        assert len(ref[0]) == 1 + 1 + disconnect_after
        assert ref[1] == ["cancelled", "closed", "background"]


def test_a_cancel_from_outside_is_not_swallowed() -> None:
    """Shutdown cancels the request's task: that cancellation goes on (only the disconnect's is
    taken back)."""

    async def main() -> None:
        async def body() -> AsyncIterator[bytes]:
            yield b"data: 0\n\n"
            await asyncio.Event().wait()

        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        async def send(_m: Any) -> None:
            pass

        t = asyncio.ensure_future(SseResponse(body())(SCOPE, receive, send))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())


def test_the_stream_ends_in_one_body_message() -> None:
    """The finish chunk, the usage chunk and [DONE] follow each other: one yield (one socket
    write), the same SSE events as one yield each."""
    import msgspec

    from deepserve.actors.flowserve.messages import TaskTokens
    from deepserve.actors.workload.messages import RequestDone
    from deepserve.daemon.api import CompletionRequest
    from deepserve.daemon.generation import Choices, Generation, Head

    async def main() -> list[bytes]:
        req = msgspec.json.decode(b'{"model": "m", "prompt": "hi", "max_tokens": 3, "stream": true, '
                                  b'"stream_options": {"include_usage": true}}', type=CompletionRequest)  # fmt: skip
        q: asyncio.Queue[object] = asyncio.Queue()
        times = (1.0, 1.02, 1.04)
        q.put_nowait(TaskTokens(task_id="c/t", request_id="c", first_index=1, token_ids=(), times_s=times[1:]))
        q.put_nowait(RequestDone(request_id="c", status="completed", reason="length", arrival_s=0.5,  # type: ignore[arg-type]
                                 first_token_s=1.0, finish_s=1.04, prompt_tokens=1, cached_prompt_tokens=0,
                                 output_tokens=3, te="te/0"))  # fmt: skip
        first = TaskTokens(task_id="c/t", request_id="c", first_index=0, token_ids=(), times_s=times[:1])
        head = Head("cmpl-x", "cmpl", "m", "fp")
        gen = Generation(None, "c", "cmpl", "m", [], req, q, first, 0, head)  # type: ignore[arg-type]
        return [b async for b in Choices(head, [gen], req).sse()]

    out = asyncio.run(main())
    events = [e for b in out for e in b.split(b"\n\n") if e]
    assert all(b.endswith(b"\n\n") for b in out)
    last = [msgspec.json.decode(e[6:]) for e in events[-3:-1]]
    assert last[0]["choices"][0]["finish_reason"] == "length" and last[1]["usage"]["completion_tokens"] == 3
    assert events[-1] == b"data: [DONE]"
    assert out[-1].count(b"data: ") == 3  # finish, usage, [DONE]: one message
    assert len(out) == len(events) - 2  # every other event its own message, as it comes


def test_events_is_the_constructed_response() -> None:
    """`SseResponse.events` (the completion routes' constructor) makes what the constructor makes."""

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 0\n\n"

    events = body()
    fast = SseResponse.events(events, "cmpl-7")
    readable = SseResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache",
                                                                             "X-Request-Id": "cmpl-7"})  # fmt: skip
    assert vars(fast) == vars(readable) and fast.body_iterator is events
    assert fast.headers == readable.headers and fast.charset == readable.charset
