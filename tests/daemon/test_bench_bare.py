"""`bench http`'s two baselines stream what the daemon streams for the load's requests: `max_tokens`
token chunks, then a chunk with the `deepserve` timings the load reads, then `[DONE]` — the
FastAPI one (issue 30's "bare FastAPI/uvicorn SSE server") with OpenAI's chunk fields."""

from __future__ import annotations

import json

import httpx2 as httpx
import pytest

from deepserve.benchmarks import http_bare, http_bare_fastapi


@pytest.mark.parametrize(("app", "path"), [(http_bare_fastapi.app, "/v1/completions"), (http_bare.app, "/")])
async def test_a_baseline_streams_max_tokens_chunks_then_timings(app: object, path: str) -> None:
    body = {"model": "m", "prompt": "p", "max_tokens": 3, "stream": True}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bare") as client:
        r = await client.post(path, json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert texts == ["word "] * 3
    assert chunks[-1]["deepserve"]["status"] == "completed" and chunks[-1]["deepserve"]["ttft_s"] > 0


async def test_the_fastapi_baseline_has_openai_chunk_fields() -> None:
    body = {"model": "m", "prompt": "p", "max_tokens": 1, "stream": True}
    transport = httpx.ASGITransport(app=http_bare_fastapi.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bare") as client:
        r = await client.post("/v1/completions", json=body)
    first = json.loads(r.text.split("\n\n")[0][6:])
    assert first["object"] == "text_completion" and first["model"] == "m" and first["id"].startswith("cmpl-")
    assert first["choices"][0]["logprobs"] is None and first["choices"][0]["finish_reason"] is None
