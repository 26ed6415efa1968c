"""The HTTP frontend: FastAPI on uvicorn, OpenAI-compatible (see README, "The daemon").

Each request: read the body (bounded), decode it with msgspec into the request Struct (an error
names the field: 400), tokenize at the edge, submit to the runtime, then stream (SSE) or collect
the tokens (`generation.py`). The TTFT deadline turns into a cancel + 504; a client that goes away
cancels its request all the way to the TE (whose master frees the KV blocks).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.flowserve.sampling import prompt_key_of
from deepserve.actors.flowserve.tokens import (
    ROOT_HASH,
    chain_hashes_from_tokens,
    combine,
    model_key,
)
from deepserve.actors.gateway.messages import REFUSED_429, is_refused
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import chat_text, make_tokenizer

from . import openapi, utility
from .api import CODE_OF_STATUS, ChatRequest, CompletionRequest, error_body, route_error_body
from .compat import UnknownFields, decode_lenient
from .config import resolved_toml
from .generation import Choices, Disconnected, Generation, GenerationFailed, Head, first_item
from .metrics import Metrics
from .runtime import NoCapacity, Runtime
from .sse import SseResponse


class HttpError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type_, self.param, self.headers = status, message, type_, param, headers
        self.code = code or CODE_OF_STATUS.get(status, "invalid_request")  # OpenAI's, not the status


def _error(exc: HttpError) -> JSONResponse:
    return JSONResponse(error_body(exc.message, exc.type_, exc.param, exc.code), exc.status,
                        headers=exc.headers)  # fmt: skip


_UNKNOWN_FIELD = re.compile(r"Object contains unknown field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]*)`(?: - at `\$\.?([^`]*)`)?")
_WRONG_TYPE = re.compile(r"Expected `[^`]*`, got `")
# A check of our own in a request Struct's __post_init__: "field: why - at `$.path`"
_OWN_CHECK = re.compile(r"([a-z_]+): .* - at `\$\.?([^`]*)`$")


def _code_of(error: str) -> str:
    """OpenAI's error code of a msgspec validation error."""
    if _UNKNOWN_FIELD.match(error):
        return "unknown_parameter"
    if _MISSING_FIELD.match(error):
        return "missing_required_parameter"
    return "invalid_type" if _WRONG_TYPE.match(error) else "invalid_value"


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
        # served name -> the model the cluster knows: the first group's (maybe under
        # daemon.served_model_name), then every other group's model by its own name
        self.served = {self.model_name: rt.cfg.cluster.model}
        self.served.update({m: m for m in rt.cfg.models() if m != rt.cfg.cluster.model})
        self.block_tokens = rt.cfg.cluster.kv_block_tokens
        sched = rt.cfg.cluster.scheduler
        # Without chunked prefill one pass takes a whole prompt: a longer one can never run.
        self.max_unchunked_tokens = None if sched.chunked_prefill else sched.max_batch_tokens
        self.unknown = UnknownFields() if self.cfg.unknown_fields == "warn" else None
        # Response ids: this start's random token + the request id (unique across restarts, and
        # the log's id in plain sight). The fingerprint names the configuration that served it.
        self.boot = secrets.token_hex(6)
        self.fingerprint = "fp_" + hashlib.blake2b(resolved_toml(rt.cfg).encode(), digest_size=5).hexdigest()

    async def read(self, request: Request) -> bytes:
        """The body, bounded by `daemon.max_body_bytes` (413)."""
        limit = self.cfg.max_body_bytes
        size = int(request.headers.get("content-length") or 0)
        if size > limit:
            raise HttpError(413, f"request body of {size} bytes exceeds {limit}", "invalid_request_error")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise HttpError(413, f"request body exceeds {limit} bytes", "invalid_request_error")
        return bytes(raw)

    def check_model(self, model: str | None) -> str:
        """The served name a request asks for (None: the first group's), or 404."""
        if model is not None and model not in self.served:
            served = ", ".join(repr(m) for m in self.served)
            raise HttpError(404, f"the model {model!r} does not exist; served: {served}",
                            "not_found_error", "model", code="model_not_found")  # fmt: skip
        return model or self.model_name

    async def body_of(self, request: Request, cls: type) -> tuple[Any, list[str]]:
        req: Any = self.decode(await self.read(request), cls)
        try:
            stops = req.stops()
        except msgspec.ValidationError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "stop") from None
        self.check_model(req.model)
        refused = req.unsupported()
        if refused is not None:
            raise HttpError(400, refused[1], "invalid_request_error", refused[0], code="unsupported_parameter")
        return req, stops

    def decode(self, raw: bytes, cls: type) -> Any:
        """A body as `cls`, or the 400 naming what is wrong (unknown fields per `unknown_fields`)."""
        try:
            if self.unknown is not None:
                return decode_lenient(raw, cls, self.unknown)
            return msgspec.json.decode(raw, type=cls)
        except msgspec.ValidationError as exc:
            text = str(exc)
            raise HttpError(400, text, "invalid_request_error", _param_of(text), code=_code_of(text)) from None
        except msgspec.DecodeError as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}", "invalid_request_error",
                            code="invalid_json") from None  # fmt: skip
        except UnicodeDecodeError as exc:  # a JSON string holding bytes that are not UTF-8
            raise HttpError(400, f"the body is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                            "invalid_request_error", code="invalid_json") from None  # fmt: skip

    def max_tokens_of(self, req: Any) -> int:
        """The request's `max_tokens` (or `max_completion_tokens`), checked with `min_tokens`."""
        max_tokens = getattr(req, "max_completion_tokens", None) or req.max_tokens or min(256, self.cfg.max_tokens_limit)
        if max_tokens > self.cfg.max_tokens_limit:
            raise HttpError(400, f"max_tokens {max_tokens} exceeds {self.cfg.max_tokens_limit}",
                            "invalid_request_error", "max_tokens")  # fmt: skip
        if req.min_tokens > max_tokens:
            raise HttpError(400, f"min_tokens {req.min_tokens} exceeds max_tokens {max_tokens}",
                            "invalid_request_error", "min_tokens")  # fmt: skip
        return int(max_tokens)

    def sampling_of(self, req: Any, rid: str, prompt_ids: list[int], max_tokens: int) -> Sampling:
        """The request's sampling: seeded by `seed`, else by its id (each request its own draw)."""
        seed = req.seed if req.seed is not None else combine(model_key(rid), self.cfg.seed & ((1 << 64) - 1))
        return Sampling(max_tokens=max_tokens, seed=seed & ((1 << 64) - 1), ignore_eos=req.ignore_eos,
                        temperature=1.0 if req.temperature is None else req.temperature,
                        top_p=1.0 if req.top_p is None else req.top_p,
                        top_k=-1 if req.top_k is None else req.top_k,
                        min_p=0.0 if req.min_p is None else req.min_p, min_tokens=req.min_tokens,
                        prompt_key=prompt_key_of(prompt_ids))  # fmt: skip

    def prompt_of(self, req: Any, text: str | list[int]) -> tuple[Prompt, list[int]]:
        """The TE's prompt and its token ids: `truncate_prompt_tokens` keeps the last k (vLLM's),
        `cache_salt` starts the block hash chain from the salt (no prefix shared without it)."""
        try:
            ids = self.tokenizer.encode(text) if isinstance(text, str) else list(text)
            if req.truncate_prompt_tokens is not None:
                ids = ids[-req.truncate_prompt_tokens :]
            root = ROOT_HASH if req.cache_salt is None else combine(ROOT_HASH, model_key("salt:" + req.cache_salt))
            return Prompt(num_tokens=len(ids), block_hashes=chain_hashes_from_tokens(ids, self.block_tokens, root)), ids
        except ValueError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "prompt") from None

    async def run(self, request: Request, req: Any, stops: list[str], text: str | list[int],
                  kind: str) -> Response:  # fmt: skip
        """Serve one request; `text` is the prompt as text, or as token ids (completions)."""
        rt, cfg = self.rt, self.cfg
        arrival = time.perf_counter()  # the wall-clock metrics' start (vLLM's arrival time)
        prompt, ids = self.prompt_of(req, text)
        if prompt.num_tokens < 1:
            raise HttpError(400, "the prompt is empty: it has no tokens", "invalid_request_error", "prompt")
        if prompt.num_tokens > cfg.max_prompt_tokens:
            raise HttpError(400, f"the prompt has {prompt.num_tokens} tokens; limit {cfg.max_prompt_tokens}",
                            "invalid_request_error", "messages" if kind == "chat" else "prompt",
                            code="context_length_exceeded")  # fmt: skip
        limit = self.max_unchunked_tokens
        if limit is not None and prompt.num_tokens > limit:
            raise HttpError(400, f"the prompt has {prompt.num_tokens} tokens; without chunked prefill one "
                            f"pass takes at most cluster.scheduler.max_batch_tokens={limit}",
                            "invalid_request_error", "messages" if kind == "chat" else "prompt")  # fmt: skip
        max_tokens = self.max_tokens_of(req)
        # Refused before acceptance, like a 400: no id, no X-Request-Id, nothing in the log (the
        # actor system is stopping, so it could not record the refusal). From here to the submit
        # nothing awaits, so a request given an id is submitted: the id names a logged request.
        if not rt.accepting or rt.driver is None:
            raise HttpError(503, "the daemon is shutting down", "service_unavailable")
        rid = rt.new_request_id(kind)
        sampling = self.sampling_of(req, rid, ids, max_tokens)
        # before the submit: the request's first token may reach the metrics before it returns
        self.metrics.arrived(rid, arrival, req.choices(), sampling.max_tokens, prompt.num_tokens)
        try:
            q = await rt.submit(rid, prompt, sampling, stream=bool(req.stream), model=self.served[self.check_model(req.model)])
        except NoCapacity as exc:  # not reached (checked above, nothing awaited since): a guard
            self.metrics.forget(rid)
            raise HttpError(503, str(exc), "service_unavailable") from None
        try:
            qs = [(rid, q), *await self._more_choices(req, rid, prompt, sampling)]
            return await self._serve(request, req, stops, kind, qs)
        except HttpError as exc:  # accepted, so in the log: the client can name it (`replay why`)
            exc.headers = {**(exc.headers or {}), "X-Request-Id": rid}
            raise

    async def _more_choices(self, req: Any, rid: str, prompt: Prompt,
                            sampling: Sampling) -> list[tuple[str, Any]]:  # fmt: skip
        """Choices 1..n-1: each its own request on the cluster (`{rid}-n{i}`), its own seed."""
        out: list[tuple[str, Any]] = []
        try:
            for i in range(1, req.choices()):
                rid_i = f"{rid}-n{i}"
                s_i = msgspec.structs.replace(sampling, seed=combine(sampling.seed, i))
                model = self.served[self.check_model(req.model)]
                out.append((rid_i, await self.rt.submit(rid_i, prompt, s_i, stream=bool(req.stream), model=model)))
        except NoCapacity as exc:
            for r in [rid, *(r for r, _ in out)]:
                await self.rt.cancel(r, f"choice {len(out) + 1} of {req.choices()} was refused: {exc}")
            raise HttpError(503, str(exc), "service_unavailable") from None
        return out

    async def _firsts(self, request: Request, qs: list[tuple[str, Any]]) -> list[Any] | Response:
        """Each choice's first item under the TTFT deadline (one deadline for all), or 499."""
        rt, deadline_s = self.rt, self.cfg.ttft_deadline_s
        end = time.monotonic() + deadline_s
        firsts = []
        try:
            for _rid, q in qs:
                firsts.append(await first_item(request, q, max(end - time.monotonic(), 1e-3)))
        except TimeoutError:
            for rid, _q in qs:
                await rt.cancel(rid, f"no first token within {deadline_s} s (TTFT deadline)")
            raise HttpError(504, f"no first token within {deadline_s} s", "timeout_error") from None
        except Disconnected:
            for rid, _q in qs:
                await rt.cancel(rid, "the client disconnected")
            return Response(status_code=499)
        return firsts

    async def _serve(self, request: Request, req: Any, stops: list[str], kind: str,
                     qs: list[tuple[str, Any]]) -> Response:  # fmt: skip
        """An accepted request from its first item (each choice's) to its response."""
        rt, rid = self.rt, qs[0][0]
        firsts = await self._firsts(request, qs)
        if isinstance(firsts, Response):
            return firsts
        refused = [f for f in firsts if isinstance(f, RequestDone) and is_refused(f.status, f.reason)]
        if refused:  # recorded by the gateway (GatewayRefused): the other choices are cancelled
            for other, _q in qs:
                await rt.cancel(other, "another choice was refused (daemon.max_inflight)")
            raise HttpError(429, f"{refused[0].reason.removeprefix(REFUSED_429)} (daemon.max_inflight)",
                            "rate_limit_error", headers={"Retry-After": "1"})  # fmt: skip
        for first in firsts:
            if isinstance(first, RequestDone) and first.status != "completed" and first.output_tokens == 0:
                for other, _q in qs:
                    await rt.cancel(other, f"another choice {first.status}")
                status = 503 if first.status == "failed" else 500
                raise HttpError(status, f"the request {first.status}: {first.reason}", "service_unavailable")
        name = self.check_model(req.model)
        head = Head(f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{self.boot}-{rid}", kind, name, self.fingerprint)
        gens = [Generation(rt, r, kind, name, stops, req, q, first, i, head)
                for i, ((r, q), first) in enumerate(zip(qs, firsts, strict=True))]  # fmt: skip
        choices = Choices(head, gens, req)
        if req.stream:
            return SseResponse.events(choices.stream(), rid)
        try:
            body = await choices.collect(request)
        except Disconnected:
            return Response(status_code=499)
        except GenerationFailed as exc:
            raise HttpError(503, str(exc), "service_unavailable") from None
        return JSONResponse(body, headers={"X-Request-Id": rid})


def create_app(rt: Runtime, metrics: Metrics) -> FastAPI:
    app = FastAPI(title="deepserve", version="0.1", description="OpenAI-compatible API of deepserve's daemon")
    fe = Frontend(rt, metrics)
    docs = openapi.install(app, fe.model_name)
    generate = openapi.errors(400, 404, 413, 429, 500, 503, 504)

    @app.exception_handler(HttpError)
    async def _on_http_error(_r: Request, exc: HttpError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _on_route_error(_r: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(route_error_body(exc.status_code, exc.detail), exc.status_code,
                            headers=getattr(exc, "headers", None))  # fmt: skip

    @app.exception_handler(Exception)
    async def _on_any(_r: Request, exc: Exception) -> JSONResponse:  # never a bare 500 page
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}: {exc}", "server_error", None,
                                       "internal_error"), 500)  # fmt: skip

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(rt.started_wall), "owned_by": "deepserve"}

    @app.get("/v1/models", responses=openapi.responses("ModelList", "The served models"))
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card(m) for m in fe.served]})

    @app.get("/v1/models/{model_id:path}", responses=openapi.responses("Model", "The model", 404))
    async def model(model_id: str) -> JSONResponse:
        return JSONResponse(model_card(fe.check_model(model_id)))

    chat_doc = openapi.responses("ChatCompletion", "The completion, or its SSE stream", stream=True)
    cmpl_doc = openapi.responses("Completion", "The completion, or its SSE stream", stream=True)

    @app.post("/v1/chat/completions", openapi_extra=docs["chat"], responses={**chat_doc, **generate})
    async def chat(request: Request) -> Response:
        req, stops = await fe.body_of(request, ChatRequest)
        text = chat_text([{"role": m.role, "content": m.text()} for m in req.messages])
        return await fe.run(request, req, stops, text, "chat")

    @app.post("/v1/completions", openapi_extra=docs["completions"], responses={**cmpl_doc, **generate})
    async def completions(request: Request) -> Response:
        req, stops = await fe.body_of(request, CompletionRequest)
        try:
            prompt = req.prompt_input()
        except ValueError as exc:
            raise HttpError(400, str(exc), "invalid_request_error", "prompt") from None
        # What `echo` sends back: the text, or the text of the token ids.
        req.prompt = prompt if isinstance(prompt, str) else fe.tokenizer.decode(prompt)
        return await fe.run(request, req, stops, prompt, "cmpl")

    # served past FastAPI's per-request layers (fastpath.py; these routes stay the readable version)
    app.state.fast_routes = {"/v1/chat/completions": chat, "/v1/completions": completions}
    app.state.fast_errors = [(HttpError, _on_http_error), (StarletteHTTPException, _on_route_error),
                             (Exception, _on_any)]  # fmt: skip

    health_doc = {200: {"description": "Serving", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}},
                  503: {"description": "Stopping", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}}}  # fmt: skip

    @app.get("/health", responses=health_doc)
    async def health() -> Response:
        ok = rt.accepting
        return JSONResponse({"status": "ok" if ok else "stopping"}, 200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse,
             responses={200: {"description": "Prometheus text exposition format",
                              "content": {"text/plain": {"schema": {"type": "string"}}}}})  # fmt: skip
    async def prom() -> Response:
        body, ctype = metrics.render(rt.status())
        return Response(body, media_type=ctype)

    # vLLM's utility endpoints (daemon/utility.py)
    @app.get("/version", responses=openapi.responses("Version", "deepserve's version"))
    async def version_() -> JSONResponse:
        return JSONResponse({"version": utility.deepserve_version()})

    ping_doc = {200: {"description": "Serving (an empty body, as vLLM's)"}, 503: {"description": "Stopping"}}

    @app.api_route("/ping", methods=["GET", "POST"], responses=ping_doc, response_class=Response)
    async def ping() -> Response:
        return Response(status_code=200 if rt.accepting else 503)

    @app.post("/tokenize", openapi_extra=docs["tokenize"],
              responses=openapi.responses("TokenizeResponse", "The prompt's tokens", 400, 404, 413))  # fmt: skip
    async def tokenize(request: Request) -> JSONResponse:
        return JSONResponse(await utility.tokenize(fe, await fe.read(request)))

    @app.post("/detokenize", openapi_extra=docs["detokenize"],
              responses=openapi.responses("DetokenizeResponse", "The tokens' text", 400, 404, 413))  # fmt: skip
    async def detokenize(request: Request) -> JSONResponse:
        return JSONResponse(await utility.detokenize(fe, await fe.read(request)))

    return app
