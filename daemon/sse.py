"""The completion routes' SSE response: Starlette's `StreamingResponse` (its readable version,
kept as the reference: tests/daemon/test_sse.py checks they send the same messages), without the
anyio task group it opens per response.

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
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def _disconnect(receive: Receive) -> None:
    """Returns once the client has gone away (StreamingResponse.listen_for_disconnect's loop)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SseResponse(StreamingResponse):
    """`StreamingResponse` (same headers, same body messages, same disconnect handling) with the
    stream in the caller's task and the disconnect watched by one asyncio task."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # not the completion routes' case: the reference path
            await super().__call__(scope, receive, send)
            return
        task = asyncio.current_task()
        assert task is not None
        gone: list[bool] = []
        streaming = [True]

        def on_disconnect(watch: asyncio.Future[Any]) -> None:
            # a callback scheduled just before the stream ended must not cancel what follows it
            if streaming and not watch.cancelled() and watch.exception() is None:
                gone.append(True)
                task.cancel()

        watch = asyncio.ensure_future(_disconnect(receive))
        watch.add_done_callback(on_disconnect)
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone:  # cancelled from outside (shutdown): not ours to take back
                raise
            task.uncancel()
        finally:
            streaming.clear()
            watch.cancel()
        if self.background is not None:
            await self.background()
