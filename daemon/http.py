"""The HTTP frontend: FastAPI on uvicorn, OpenAI-compatible (see README, "The daemon").

Each request: read the body (bounded), decode it with msgspec into the request Struct (an error
names the field: 400), tokenize at the edge, submit to the ingress, then stream (SSE) or collect
the tokens. The TTFT deadline turns into a cancel + 504; a client that goes away cancels its
request all the way to the TE (whose master frees the KV blocks). Stop sequences are matched
here, on the text; a match cancels the rest of the generation (reason recorded).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from deepserve.actors.flowserve.messages import Sampling, TaskTokens
from deepserve.actors.flowserve.tokens import combine, model_key
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import chat_text, make_tokenizer, output_text, prompt_of_text

from .api import ChatRequest, CompletionRequest, error_body, usage
from .metrics import Metrics
from .runtime import NoCapacity, Overloaded, Runtime

DISCONNECT_POLL_S = 0.25


class HttpError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type_, self.param, self.headers = status, message, type_, param, headers


def _error(exc: HttpError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type_, exc.param, str(exc.status)), exc.status,
                        headers=exc.headers)  # fmt: skip


def create_app(rt: Runtime, metrics: Metrics) -> FastAPI:
    app = FastAPI(title="deepserve", version="0.1", description="OpenAI-compatible API of deepserve's daemon")
    cfg = rt.cfg.daemon
    tokenizer = make_tokenizer(cfg.tokenizer)
    model_name = rt.cfg.model_name()
    block = rt.cfg.cluster.kv_block_tokens

    async def body_of(request: Request, cls: type) -> Any:
        size = int(request.headers.get("content-length") or 0)
        if size > cfg.max_body_bytes:
            raise HttpError(413, f"request body of {size} bytes exceeds {cfg.max_body_bytes}", "invalid_request_error")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > cfg.max_body_bytes:
                raise HttpError(413, f"request body exceeds {cfg.max_body_bytes} bytes", "invalid_request_error")
        try:
            req = msgspec.json.decode(bytes(raw), type=cls)
            stops = req.stops()
        except msgspec.ValidationError as exc:
            text = str(exc)
            param = text.rpartition("`$.")[2].rstrip("`") if "`$." in text else None
            raise HttpError(400, text, "invalid_request_error", param) from None
        except msgspec.DecodeError as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}", "invalid_request_error") from None
        if req.model != model_name:
            raise HttpError(404, f"the model {req.model!r} does not exist; served: {model_name!r}",
                            "not_found_error", "model")  # fmt: skip
        return req, stops

    def sampling_of(req: Any, rid: str) -> Sampling:
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        if max_tokens > cfg.max_tokens_limit:
            raise HttpError(400, f"max_tokens {max_tokens} exceeds {cfg.max_tokens_limit}", "invalid_request_error",
                            "max_tokens")  # fmt: skip
        seed = req.seed if req.seed is not None else combine(model_key(rid), cfg.seed & ((1 << 64) - 1))
        return Sampling(max_tokens=max_tokens, seed=seed & ((1 << 64) - 1), ignore_eos=req.ignore_eos)

    async def run(request: Request, req: Any, stops: list[str], text: str, kind: str) -> Response:
        rid = rt.new_request_id(kind)
        try:
            prompt, _ids = prompt_of_text(tokenizer, text, block)
        except ValueError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "prompt") from None
        if prompt.num_tokens > cfg.max_prompt_tokens:
            raise HttpError(400, f"the prompt has {prompt.num_tokens} tokens; limit {cfg.max_prompt_tokens}",
                            "invalid_request_error", "messages" if kind == "chat" else "prompt")  # fmt: skip
        sampling = sampling_of(req, rid)
        try:
            q = await rt.submit(rid, prompt, sampling)
        except Overloaded as exc:
            raise HttpError(429, str(exc), "rate_limit_error", headers={"Retry-After": "1"}) from None
        except NoCapacity as exc:
            raise HttpError(503, str(exc), "service_unavailable") from None
        t0 = time.perf_counter()
        try:
            first = await _first(request, q, cfg.ttft_deadline_s)
        except TimeoutError:
            await rt.cancel(rid, f"no first token within {cfg.ttft_deadline_s} s (TTFT deadline)")
            raise HttpError(504, f"no first token within {cfg.ttft_deadline_s} s", "timeout_error") from None
        except _Disconnected:
            await rt.cancel(rid, "the client disconnected")
            return Response(status_code=499)
        metrics.client_ttft(time.perf_counter() - t0)
        if isinstance(first, RequestDone) and first.status != "completed" and first.output_tokens == 0:
            status = 503 if first.status == "failed" else 500
            raise HttpError(status, f"the request {first.status}: {first.reason}", "service_unavailable")
        gen = _Generation(rt, rid, kind, model_name, stops, req, q, first)
        if req.stream:
            return StreamingResponse(gen.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": rid})  # fmt: skip
        try:
            body = await gen.collect(request)
        except _Disconnected:
            return Response(status_code=499)
        return JSONResponse(body, headers={"X-Request-Id": rid})

    @app.exception_handler(HttpError)
    async def _on_http_error(_r: Request, exc: HttpError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(Exception)
    async def _on_any(_r: Request, exc: Exception) -> JSONResponse:  # never a bare 500 page
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), 500)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(rt.started_wall),
                                            "owned_by": "deepserve"}]}  # fmt: skip

    (chat_schema, cmpl_schema), components = msgspec.json.schema_components(
        (ChatRequest, CompletionRequest), ref_template="#/components/schemas/{name}")

    def body_doc(schema: dict[str, Any]) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    def openapi() -> dict[str, Any]:  # the msgspec request schemas in the OpenAPI document
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.post("/v1/chat/completions", openapi_extra=body_doc(chat_schema))
    async def chat(request: Request) -> Response:
        req, stops = await body_of(request, ChatRequest)
        text = chat_text([{"role": m.role, "content": m.content} for m in req.messages])
        return await run(request, req, stops, text, "chat")

    @app.post("/v1/completions", openapi_extra=body_doc(cmpl_schema))
    async def completions(request: Request) -> Response:
        req, stops = await body_of(request, CompletionRequest)
        if isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise HttpError(400, "exactly one prompt per request", "invalid_request_error", "prompt")
            req.prompt = req.prompt[0]
        return await run(request, req, stops, req.prompt, "cmpl")

    @app.get("/health")
    async def health() -> Response:
        ok = rt.accepting
        return JSONResponse({"status": "ok" if ok else "stopping"}, 200 if ok else 503)

    @app.get("/metrics")
    async def prom() -> Response:
        body, ctype = metrics.render(rt.status())
        return Response(body, media_type=ctype)

    return app


class _Disconnected(Exception):
    pass


async def _first(request: Request, q: asyncio.Queue[Any], deadline_s: float) -> Any:
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            return await asyncio.wait_for(q.get(), min(left, DISCONNECT_POLL_S))
        except TimeoutError:
            if await request.is_disconnected():
                raise _Disconnected from None


class _Generation:
    """One request's output: SSE chunks or one JSON body; stop sequences matched on the text."""

    def __init__(self, rt: Runtime, rid: str, kind: str, model: str, stops: list[str], req: Any,
                 q: asyncio.Queue[Any], first: Any) -> None:  # fmt: skip
        self.rt, self.rid, self.kind, self.model, self.stops, self.req, self.q = rt, rid, kind, model, stops, req, q
        self.pending = first
        self.text = ""
        self.tokens = 0
        self.finish_reason: str | None = None
        self.done: RequestDone | None = None
        self.created = int(time.time())

    async def _next(self) -> Any:
        if self.pending is not None:
            item, self.pending = self.pending, None
            return item
        return await self.q.get()

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces until the terminal message (or a stop sequence). With stop sequences, the
        last `len(longest stop) - 1` characters are held back until they cannot start a match."""
        hold = max((len(x) for x in self.stops), default=1) - 1
        sent = 0
        while self.done is None:
            item = await self._next()
            if isinstance(item, RequestDone):
                self.done = item
                if self.finish_reason is None:
                    self.finish_reason = "length" if item.reason in ("length", "target") else "stop"
                    if item.status != "completed":
                        self.finish_reason = "stop" if item.reason == "stop sequence" else "abort"
                if len(self.text) > sent:
                    yield self.text[sent:]
                return
            if not isinstance(item, TaskTokens) or self.finish_reason is not None:
                continue
            self.tokens += len(item.token_ids) or len(item.times_s)
            self.text += output_text(item.token_ids)
            hits = [h for h in (self.text.find(x, max(0, sent - hold)) for x in self.stops) if h >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.finish_reason = "stop"
                await self.rt.cancel(self.rid, "stop sequence")
                continue
            upto = len(self.text) - hold
            if upto > sent:
                yield self.text[sent:upto]
                sent = upto

    def _usage(self) -> dict[str, Any]:
        d = self.done
        prompt = d.prompt_tokens if d is not None else 0
        return usage(prompt, self.tokens, d.cached_prompt_tokens if d is not None else 0)

    def _emulated(self) -> dict[str, Any]:
        """The emulated timings of the request (the TE's token times on the daemon's clock)."""
        d = self.done
        if d is None or d.first_token_s is None:
            return {}
        tpot = (d.finish_s - d.first_token_s) / (d.output_tokens - 1) if d.output_tokens > 1 else None
        return {"ttft_s": d.first_token_s - d.arrival_s, "tpot_s": tpot, "status": d.status}

    def _chunk(self, delta: str | None, finish: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "delta": {} if delta is None else {"content": delta}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    async def sse(self) -> AsyncIterator[bytes]:
        enc = msgspec.json.encode
        try:
            if self.kind == "chat":
                first = self._chunk(None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield b"data: " + enc(first) + b"\n\n"
            async for piece in self.pieces():
                yield b"data: " + enc(self._chunk(piece, None)) + b"\n\n"
            yield b"data: " + enc(self._chunk(None, self.finish_reason)) + b"\n\n"
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                final = self._chunk(None, None)
                final["choices"], final["usage"] = [], self._usage()
                final["deepserve"] = self._emulated()  # for `deepserve bench http` (platform overhead)
                yield b"data: " + enc(final) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if self.done is None:  # the client went away mid-stream: cancel to the TE
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.rt.cancel(self.rid, "the client disconnected"))

    async def collect(self, request: Request) -> dict[str, Any]:
        task = asyncio.ensure_future(self._drain())
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await self.rt.cancel(self.rid, "the client disconnected")
                raise _Disconnected
        task.result()
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text},
                      "finish_reason": self.finish_reason}  # fmt: skip
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": self.text, "finish_reason": self.finish_reason, "logprobs": None}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self._usage()}  # fmt: skip

    async def _drain(self) -> None:
        async for _ in self.pieces():
            pass
