"""The baseline issue 30 names: "a bare FastAPI/uvicorn SSE server with the same emulated pacing",
written the way a user writes one (and the way vLLM's OpenAI server is built): a FastAPI route that
reads the JSON body and returns a StreamingResponse whose async generator yields OpenAI-shaped
completion chunks, encoded with `json.dumps`, sleeping BARE_TTFT_S before the first and BARE_TPOT_S
between the others. No validation, no tokenizer, no engine, no log. Its chunks have the daemon's
fields (id, object, created, model, system_fingerprint, choices[].logprobs/finish_reason), so both
servers write the same kind of bytes. `http_bare.py` is the stricter baseline beside it: raw ASGI,
no framework, minimal chunks."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

TTFT_S = float(os.environ.get("BARE_TTFT_S", "0.02"))
TPOT_S = float(os.environ.get("BARE_TPOT_S", "0.02"))

app = FastAPI()
_ids = itertools.count()


def _chunk(rid: str, created: int, model: str, choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {"id": rid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": "fp_bare", "choices": choices, **extra}  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


@app.get("/")
async def root() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/v1/completions")
async def completions(request: Request) -> StreamingResponse:
    body = await request.json()
    tokens, model = int(body.get("max_tokens", 16)), str(body.get("model", "bare"))
    rid, created = f"cmpl-bare-{next(_ids)}", int(time.time())

    async def stream() -> AsyncIterator[str]:
        await asyncio.sleep(TTFT_S)
        for i in range(tokens):
            if i:
                await asyncio.sleep(TPOT_S)
            yield _chunk(rid, created, model, [{"index": 0, "text": "word ", "logprobs": None, "finish_reason": None}])
        yield _chunk(rid, created, model, [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}])
        usage = {"prompt_tokens": 0, "completion_tokens": tokens, "total_tokens": tokens}
        yield _chunk(rid, created, model, [], usage=usage,
                     deepserve={"ttft_s": TTFT_S, "tpot_s": TPOT_S, "status": "completed"})  # fmt: skip
        yield "data: [DONE]\n\n"

    return StreamingResponse(stream(), media_type="text/event-stream")
