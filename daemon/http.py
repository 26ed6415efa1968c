"""The HTTP frontend: FastAPI on uvicorn, OpenAI-compatible (see README, "The daemon").

Each request: read the body (bounded), decode it with msgspec into the request Struct (an error
names the field: 400), tokenize at the edge, submit to the runtime, then stream (SSE) or collect
the tokens (`generation.py`). The TTFT deadline turns into a cancel + 504; a client that goes away
cancels its request all the way to the TE (whose master frees the KV blocks).
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.tokens import combine, model_key
from deepserve.actors.gateway.messages import REFUSED_429, is_refused
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import chat_text, make_tokenizer, prompt_of_ids, prompt_of_text

from .api import ChatRequest, CompletionRequest, error_body, route_error_body
from .generation import Disconnected, Generation, GenerationFailed, first_item
from .metrics import Metrics
from .runtime import NoCapacity, Runtime


class HttpError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type_, self.param, self.headers = status, message, type_, param, headers


def _error(exc: HttpError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type_, exc.param, str(exc.status)), exc.status,
                        headers=exc.headers)  # fmt: skip


_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")
# A check of our own in a request Struct's __post_init__: "field: why - at `$.path`"
_OWN_CHECK = re.compile(r"([a-z_]+): .* - at `\$\.?([^`]*)`$")


def _param_of(error: str) -> str | None:
    """The field a msgspec validation error is about, as OpenAI's `param` names it:
    `messages[0].role`; an unknown field by its own name (`max_token`)."""
    named = _UNKNOWN_FIELD.match(error) or _MISSING_FIELD.match(error) or _OWN_CHECK.match(error)
    if named:
        field, where = named.groups()
        return f"{where}.{field}" if where else field
    return error.rpartition("`$.")[2].rstrip("`") if "`$." in error else None


class Frontend:
    """The request path shared by the completion routes: body → request Struct → prompt and
    sampling → submit → the first item under the TTFT deadline → a streaming or JSON response."""

    def __init__(self, rt: Runtime, metrics: Metrics) -> None:
        self.rt, self.metrics, self.cfg = rt, metrics, rt.cfg.daemon
        self.tokenizer = make_tokenizer(self.cfg.tokenizer)
        self.model_name = rt.cfg.model_name()
        self.block_tokens = rt.cfg.cluster.kv_block_tokens
        sched = rt.cfg.cluster.scheduler
        # Without chunked prefill one pass takes a whole prompt: a longer one can never run.
        self.max_unchunked_tokens = None if sched.chunked_prefill else sched.max_batch_tokens

    async def body_of(self, request: Request, cls: type) -> tuple[Any, list[str]]:
        limit = self.cfg.max_body_bytes
        size = int(request.headers.get("content-length") or 0)
        if size > limit:
            raise HttpError(413, f"request body of {size} bytes exceeds {limit}", "invalid_request_error")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise HttpError(413, f"request body exceeds {limit} bytes", "invalid_request_error")
        try:
            req: Any = msgspec.json.decode(bytes(raw), type=cls)
            stops = req.stops()
        except msgspec.ValidationError as exc:
            text = str(exc)
            raise HttpError(400, text, "invalid_request_error", _param_of(text)) from None
        except msgspec.DecodeError as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}", "invalid_request_error") from None
        except UnicodeDecodeError as exc:  # a JSON string holding bytes that are not UTF-8
            raise HttpError(400, f"the body is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                            "invalid_request_error") from None  # fmt: skip
        if req.model != self.model_name:
            raise HttpError(404, f"the model {req.model!r} does not exist; served: {self.model_name!r}",
                            "not_found_error", "model")  # fmt: skip
        refused = req.unsupported()
        if refused is not None:
            raise HttpError(400, refused[1], "invalid_request_error", refused[0])
        return req, stops

    def sampling_of(self, req: Any, rid: str) -> Sampling:
        max_tokens = req.max_completion_tokens or req.max_tokens or 256
        if max_tokens > self.cfg.max_tokens_limit:
            raise HttpError(400, f"max_tokens {max_tokens} exceeds {self.cfg.max_tokens_limit}",
                            "invalid_request_error", "max_tokens")  # fmt: skip
        seed = req.seed if req.seed is not None else combine(model_key(rid), self.cfg.seed & ((1 << 64) - 1))
        return Sampling(max_tokens=max_tokens, seed=seed & ((1 << 64) - 1), ignore_eos=req.ignore_eos)

    async def run(self, request: Request, req: Any, stops: list[str], text: str | list[int],
                  kind: str) -> Response:  # fmt: skip
        """Serve one request; `text` is the prompt as text, or as token ids (completions)."""
        rt, cfg = self.rt, self.cfg
        rid = rt.new_request_id(kind)
        try:
            if isinstance(text, str):
                prompt, _ids = prompt_of_text(self.tokenizer, text, self.block_tokens)
            else:
                prompt = prompt_of_ids(text, self.block_tokens)
        except ValueError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "prompt") from None
        if prompt.num_tokens < 1:
            raise HttpError(400, "the prompt is empty: it has no tokens", "invalid_request_error", "prompt")
        if prompt.num_tokens > cfg.max_prompt_tokens:
            raise HttpError(400, f"the prompt has {prompt.num_tokens} tokens; limit {cfg.max_prompt_tokens}",
                            "invalid_request_error", "messages" if kind == "chat" else "prompt")  # fmt: skip
        limit = self.max_unchunked_tokens
        if limit is not None and prompt.num_tokens > limit:
            raise HttpError(400, f"the prompt has {prompt.num_tokens} tokens; without chunked prefill one "
                            f"pass takes at most cluster.scheduler.max_batch_tokens={limit}",
                            "invalid_request_error", "messages" if kind == "chat" else "prompt")  # fmt: skip
        sampling = self.sampling_of(req, rid)
        try:
            q = await rt.submit(rid, prompt, sampling, stream=bool(req.stream))
        except NoCapacity as exc:
            raise HttpError(503, str(exc), "service_unavailable") from None
        try:
            return await self._serve(request, req, stops, kind, rid, q)
        except HttpError as exc:  # accepted, so in the log: the client can name it (`replay why`)
            exc.headers = {**(exc.headers or {}), "X-Request-Id": rid}
            raise

    async def _serve(self, request: Request, req: Any, stops: list[str], kind: str, rid: str,
                     q: Any) -> Response:  # fmt: skip
        """An accepted request from its first item to its response."""
        rt, cfg = self.rt, self.cfg
        t0 = time.perf_counter()
        try:
            first = await first_item(request, q, cfg.ttft_deadline_s)
        except TimeoutError:
            await rt.cancel(rid, f"no first token within {cfg.ttft_deadline_s} s (TTFT deadline)")
            raise HttpError(504, f"no first token within {cfg.ttft_deadline_s} s", "timeout_error") from None
        except Disconnected:
            await rt.cancel(rid, "the client disconnected")
            return Response(status_code=499)
        if isinstance(first, RequestDone) and is_refused(first.status, first.reason):  # recorded: GatewayRefused
            raise HttpError(429, f"{first.reason.removeprefix(REFUSED_429)} (daemon.max_inflight)",
                            "rate_limit_error", headers={"Retry-After": "1"})  # fmt: skip
        self.metrics.client_ttft(time.perf_counter() - t0)
        if isinstance(first, RequestDone) and first.status != "completed" and first.output_tokens == 0:
            status = 503 if first.status == "failed" else 500
            raise HttpError(status, f"the request {first.status}: {first.reason}", "service_unavailable")
        gen = Generation(rt, rid, kind, self.model_name, stops, req, q, first)
        if req.stream:
            return StreamingResponse(gen.sse(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Request-Id": rid})  # fmt: skip
        try:
            body = await gen.collect(request)
        except Disconnected:
            return Response(status_code=499)
        except GenerationFailed as exc:
            raise HttpError(503, str(exc), "service_unavailable") from None
        return JSONResponse(body, headers={"X-Request-Id": rid})


def _use_msgspec_schemas(app: FastAPI) -> dict[str, dict[str, Any]]:
    """Put the msgspec request schemas into the OpenAPI document; return each route's body doc."""
    (chat_schema, cmpl_schema), components = msgspec.json.schema_components(
        (ChatRequest, CompletionRequest), ref_template="#/components/schemas/{name}")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def body_doc(schema: dict[str, Any]) -> dict[str, Any]:
        return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}

    return {"chat": body_doc(chat_schema), "completions": body_doc(cmpl_schema)}


def create_app(rt: Runtime, metrics: Metrics) -> FastAPI:
    app = FastAPI(title="deepserve", version="0.1", description="OpenAI-compatible API of deepserve's daemon")
    fe = Frontend(rt, metrics)
    docs = _use_msgspec_schemas(app)

    @app.exception_handler(HttpError)
    async def _on_http_error(_r: Request, exc: HttpError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _on_route_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(route_error_body(exc.status_code, exc.detail), exc.status_code,
                            headers=getattr(exc, "headers", None))  # fmt: skip

    @app.exception_handler(Exception)
    async def _on_any(_r: Request, exc: Exception) -> JSONResponse:  # never a bare 500 page
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error"), 500)

    def model_card() -> dict[str, Any]:
        return {"id": fe.model_name, "object": "model", "created": int(rt.started_wall), "owned_by": "deepserve"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != fe.model_name:
            raise HttpError(404, f"the model {model_id!r} does not exist; served: {fe.model_name!r}",
                            "not_found_error", "model")  # fmt: skip
        return model_card()

    @app.post("/v1/chat/completions", openapi_extra=docs["chat"])
    async def chat(request: Request) -> Response:
        req, stops = await fe.body_of(request, ChatRequest)
        text = chat_text([{"role": m.role, "content": m.text()} for m in req.messages])
        return await fe.run(request, req, stops, text, "chat")

    @app.post("/v1/completions", openapi_extra=docs["completions"])
    async def completions(request: Request) -> Response:
        req, stops = await fe.body_of(request, CompletionRequest)
        try:
            prompt = req.prompt_input()
        except ValueError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "prompt") from None
        # What `echo` sends back: the text, or the text of the token ids.
        req.prompt = prompt if isinstance(prompt, str) else fe.tokenizer.decode(prompt)
        return await fe.run(request, req, stops, prompt, "cmpl")

    @app.get("/health")
    async def health() -> Response:
        ok = rt.accepting
        return JSONResponse({"status": "ok" if ok else "stopping"}, 200 if ok else 503)

    @app.get("/metrics")
    async def prom() -> Response:
        body, ctype = metrics.render(rt.status())
        return Response(body, media_type=ctype)

    return app
