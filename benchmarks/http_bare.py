"""The baseline of `deepserve bench http`: a bare ASGI SSE endpoint on uvicorn (no framework, no
actors, no log) that streams `max_tokens` chunks, sleeping BARE_TTFT_S before the first and
BARE_TPOT_S between the others — the same emulated pace the daemon's run measured."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

TTFT_S = float(os.environ.get("BARE_TTFT_S", "0.02"))
TPOT_S = float(os.environ.get("BARE_TPOT_S", "0.02"))


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    tokens = int(json.loads(body or b"{}").get("max_tokens", 16))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await asyncio.sleep(TTFT_S)
    for i in range(tokens):
        if i:
            await asyncio.sleep(TPOT_S)
        chunk = {"choices": [{"index": 0, "text": "word ", "finish_reason": None}]}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                    "more_body": True})  # fmt: skip
    final = {"choices": [], "deepserve": {"ttft_s": TTFT_S, "tpot_s": TPOT_S, "status": "completed"}}
    await send({"type": "http.response.body", "body": b"data: " + json.dumps(final).encode() + b"\n\ndata: [DONE]\n\n"})
