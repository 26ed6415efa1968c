"""The OpenAPI document: request bodies from the msgspec request Structs, and every response a
route gives — success bodies (the Structs below, which describe what generation.py and http.py
send) and OpenAI's error object for each 4xx/5xx. Schemathesis checks the daemon against it
(tests/daemon/test_openapi_schemathesis.py)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from fastapi import FastAPI

from .api import ChatRequest, CompletionRequest
from .utility import DetokenizeRequest, TokenizeChatRequest, TokenizeCompletionRequest


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None  # OpenAI's codes: model_not_found, unknown_parameter, rate_limit_exceeded, ...


class ErrorResponse(msgspec.Struct):
    error: ErrorInfo


class Model(msgspec.Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[Model]


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(msgspec.Struct):
    role: Literal["assistant"]
    content: str | None
    refusal: None
    tool_calls: list[Any] = []


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length", "abort"] | None
    stop_reason: str | int | None = None  # vLLM's: the stop string or token id that ended it


class ChatCompletion(msgspec.Struct):
    id: str  # chatcmpl-<start token>-<request id>
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(msgspec.Struct):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: None = None


class ChunkChoice(msgspec.Struct):
    index: int
    logprobs: None
    finish_reason: Literal["stop", "length", "abort"] | None
    stop_reason: str | int | None = None  # with the finish reason
    delta: ChunkDelta | None = None  # chat
    text: str | None = None  # completions


class EmulatedTimes(msgspec.Struct):
    """`deepserve` in a stream's usage chunk: the emulated times of the request (choice 0)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    status: str | None = None


class CompletionChunk(msgspec.Struct):
    """One `data:` event of a stream (`chat.completion.chunk` or `text_completion`)."""

    id: str
    object: Literal["chat.completion.chunk", "text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    deepserve: EmulatedTimes | None = None


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length", "abort"] | None
    stop_reason: str | int | None = None


class Completion(msgspec.Struct):
    id: str  # cmpl-<start token>-<request id>
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage


class TokenizeResponse(msgspec.Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


class Version(msgspec.Struct):
    version: str


class Health(msgspec.Struct):
    status: Literal["ok", "stopping"]


_BODIES = (ChatRequest, CompletionRequest, TokenizeCompletionRequest, TokenizeChatRequest, DetokenizeRequest)
_RESPONSES = (ErrorResponse, ModelList, Model, ChatCompletion, Completion, CompletionChunk, TokenizeResponse,
              DetokenizeResponse, Version, Health)  # fmt: skip
ERROR_TEXT = {
    400: "A field is wrong, unknown or asks what deepserve cannot do (OpenAI's error object; `param` names it)",
    404: "The model is not the one served (`model_not_found`)",
    413: "The body exceeds `daemon.max_body_bytes`",
    429: "Over `daemon.max_inflight` requests in flight (`Retry-After: 1`)",
    500: "The request was cancelled before its first token, or an internal error",
    503: "Shutting down, no capacity, or the request failed on the TE",
    504: "No first token within `daemon.ttft_deadline_s` (the request is cancelled)",
}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: _json("ErrorResponse", ERROR_TEXT[s]) for s in statuses}


def responses(name: str, description: str, *statuses: int, stream: bool = False) -> dict[int | str, dict[str, Any]]:
    """A route's responses: 200 with `name` (and SSE events of CompletionChunk when `stream`),
    then the error object for each status."""
    ok = _json(name, description)
    if stream:
        ok["content"]["text/event-stream"] = {"schema": {"type": "string", "description": (
            "with `stream: true`: `data: <CompletionChunk JSON>` events, then `data: [DONE]`")}}  # fmt: skip
    return {200: ok, **errors(*statuses)}


def install(app: FastAPI, model: str) -> dict[str, dict[str, Any]]:
    """Put the msgspec schemas into the OpenAPI document; return each route's request body doc
    (with an example of the served `model`)."""
    bodies, components = msgspec.json.schema_components((*_BODIES, *_RESPONSES),
                                                        ref_template="#/components/schemas/{name}")  # fmt: skip

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(components)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def body_doc(schema: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
        media = {"schema": schema, "example": example}
        return {"requestBody": {"required": True, "content": {"application/json": media}}}

    messages = [{"role": "user", "content": "Tell me about the river."}]
    tokenize = {"anyOf": [bodies[2], bodies[3]]}
    return {
        "chat": body_doc(bodies[0], {"model": model, "messages": messages, "max_tokens": 8}),
        "completions": body_doc(bodies[1], {"model": model, "prompt": "Once upon a time", "max_tokens": 8}),
        "tokenize": body_doc(tokenize, {"model": model, "prompt": "Once upon a time"}),
        "detokenize": body_doc(bodies[4], {"model": model, "tokens": [1, 2, 3]}),
    }
