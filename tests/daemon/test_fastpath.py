"""The completion routes served past FastAPI's layers (daemon/fastpath.py) answer as the
FastAPI app's routes do (the readable version): the same requests both ways, streamed or not,
good or refused, give the same status, headers and bytes (ids, creation times, cached-token
counts and emulated timings aside: they name the request or depend on what ran before)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from inproc import FAST, quiet, started

from deepserve.daemon.fastpath import FastRoutes, fast_routes
from deepserve.daemon.http import create_app

REQUESTS: list[tuple[str, Any]] = [
    ("/v1/completions", {"model": "llama3-8b", "prompt": "the fast path", "max_tokens": 6, "seed": 7,
                         "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"model": "llama3-8b", "prompt": "the fast path", "max_tokens": 6, "seed": 7}),
    ("/v1/chat/completions", {"model": "llama3-8b", "messages": [{"role": "user", "content": "hi"}], "n": 2,
                              "max_tokens": 5, "seed": 3, "stream": True, "ignore_eos": True}),
    ("/v1/chat/completions", {"model": "llama3-8b", "messages": [{"role": "user", "content": "hi"}],
                              "max_tokens": 9, "seed": 4, "stop": ["e"]}),
    ("/v1/completions", b"{not json"),
    ("/v1/completions", {"model": "llama3-8b", "prompt": "x", "max_token": 3}),
    ("/v1/chat/completions", {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"model": "llama3-8b", "messages": [{"role": "user", "content": "hi"}],
                              "tools": [{"type": "function"}]}),
    ("/v1/completions", {"model": "llama3-8b", "prompt": "", "max_tokens": 3}),
]  # fmt: skip


async def _call(app: Any, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}  # fmt: skip
    sent: list[dict[str, Any]] = []
    first = [True]

    async def receive() -> dict[str, Any]:
        if first:
            first.clear()
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _norm(status: int, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], str]:
    text = body.decode()
    text = re.sub(r"(chatcmpl|cmpl)-[0-9a-f]+-(chat|cmpl)-\d+", "ID", text)
    text = re.sub(r'"created":\d+', '"created":T', text)
    text = re.sub(r'"cached_tokens":\d+', '"cached_tokens":C', text)
    text = re.sub(r'"deepserve":\{[^}]*\}', '"deepserve":E', text)
    headers = {k: v for k, v in headers.items() if k not in ("content-length", "x-request-id")}
    return status, headers, text


def test_the_fast_routes_answer_as_the_apps_routes(tmp_path: Path) -> None:
    async def main() -> list[tuple[Any, Any]]:
        rt, metrics = await started(tmp_path / "run", *FAST)
        try:
            app = create_app(rt, metrics)
            fast = fast_routes(app)
            assert isinstance(fast, FastRoutes)
            pairs = []
            for path, req in REQUESTS:
                body = req if isinstance(req, bytes) else json.dumps(req).encode()
                slow_r = await _call(app, path, body)
                fast_r = await _call(fast, path, body)
                assert int(slow_r[1].get("content-length", len(slow_r[2]))) == len(slow_r[2])
                assert int(fast_r[1].get("content-length", len(fast_r[2]))) == len(fast_r[2])
                pairs.append((_norm(*slow_r), _norm(*fast_r)))
            return pairs
        finally:
            await rt.stop(grace_s=1.0)

    with quiet():
        pairs = asyncio.run(main())
    statuses = [a[0] for a, _b in pairs]
    assert statuses == [200, 200, 200, 200, 400, 400, 404, 400, 400]
    for (path, _req), (slow, fast) in zip(REQUESTS, pairs, strict=True):
        assert fast == slow, path
    assert "data: [DONE]" in pairs[0][0][2]


def test_other_requests_go_to_the_app() -> None:
    seen: list[str] = []

    async def app(scope: Any, _receive: Any, _send: Any) -> None:
        seen.append(f"{scope['method']} {scope['path']}")

    async def never(_request: Any) -> Any:
        raise AssertionError("not a fast route")

    fast = FastRoutes(app, {"/v1/completions": never}, [])
    for method, path in (("GET", "/v1/completions"), ("POST", "/v1/completions/"), ("POST", "/v1/models")):
        asyncio.run(fast({"type": "http", "method": method, "path": path}, None, None))
    assert seen == ["GET /v1/completions", "POST /v1/completions/", "POST /v1/models"]
