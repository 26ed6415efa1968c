"""OpenAI-compatible request bodies (msgspec: an error names the field) and response shapes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Temp = Annotated[float, msgspec.Meta(ge=0, le=2)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
MaxTok = Annotated[int, msgspec.Meta(ge=1)]
Seed = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]  # OpenAI's range
# vLLM's sampling extensions, with vLLM's ranges (-1 or 0: top_k off)
TopK = Annotated[int, msgspec.Meta(ge=-1, le=1 << 20)]
MinP = Annotated[float, msgspec.Meta(ge=0, le=1)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0, le=100)]
MAX_STOPS = 4  # OpenAI's limit
MAX_MESSAGES = 4096
MAX_TOKEN_ID = 1 << 32  # token ids in a prompt: any vocabulary's ids fit


class TextPart(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    """A content part. Only text: any other `type` (image_url, input_audio, file) is a
    400 naming `messages[i].content[j].type`, since the emulated model reads no media."""

    text: str


class ChatMessage(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    # A string, or text parts (OpenAI's array form, which many clients send); null for an
    # assistant turn that only called tools.
    content: str | list[TextPart] | None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[Any] | None = None  # history only: turns a client sends back
    # What OpenAI's clients put in an assistant turn they send back (a response message as
    # is): history, read by no one here. Any other field is a 400 naming it.
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: Any = None
    function_call: Any = None

    def __post_init__(self) -> None:
        # As OpenAI: only an assistant turn (one that called tools) may have no content.
        # msgspec reports this at the message's path (`messages[0]`); the text names the field.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content: required for a {self.role} message (got null)")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)  # as vLLM joins text parts


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    include_usage: bool = False


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: Any = None


# OpenAI fields deepserve cannot honour: accepted at their neutral value (clients often send
# it), otherwise a 400 naming the field. Never ignored: a request whose output would differ
# from what was asked fails, rather than succeeding silently.
NO_PROBS = "deepserve's emulated model has no token probabilities"
NO_TOOLS = "deepserve's emulated model does not call functions"


def _refuse(field: str, why: str, value: str = "") -> tuple[str, str]:
    return field, f"`{field}`{value} is not supported: {why}"


class _Common(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    max_tokens: MaxTok | None = None
    max_completion_tokens: MaxTok | None = None
    temperature: Temp = 1.0
    top_p: TopP = 1.0
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, msgspec.Meta(ge=1, le=1)] = 1
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens
    user: str | None = None
    presence_penalty: Penalty = 0.0  # checked by `unsupported` (0 only)
    frequency_penalty: Penalty = 0.0
    # vLLM's sampling extensions, which vLLM clients send: top_k and min_p narrow the sampling as
    # top_p does (accepted, as top_p is); repetition_penalty depends on what came before, as the
    # penalties above do (1 only)
    top_k: TopK = -1
    min_p: MinP = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    # Accepted and without effect here: they change no output.
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # Checked by `unsupported` (neutral values only).
    logit_bias: dict[str, float] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > MAX_STOPS:
            raise msgspec.ValidationError(f"at most {MAX_STOPS} stop sequences - at `$.stop`")
        return [s for s in stops if s]

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field asking what deepserve cannot do."""
        if self.logit_bias:
            return _refuse("logit_bias", NO_PROBS)
        for field, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)):
            value = getattr(self, field)
            if value != neutral:
                return _refuse(field, "the emulated model's tokens do not depend on what came before",
                               f" {value}")  # fmt: skip
        if self.stream_options is not None and not self.stream:
            return "stream_options", "`stream_options` is only allowed when `stream` is true"
        return None


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs or self.top_logprobs:
            return _refuse("logprobs" if self.logprobs else "top_logprobs", NO_PROBS)
        if self.tools:
            return _refuse("tools", NO_TOOLS)
        if self.tool_choice not in (None, "none", "auto"):
            return _refuse("tool_choice", NO_TOOLS, f" {self.tool_choice!r}")
        if self.response_format is not None and self.response_format.type != "text":
            return _refuse("response_format", "the emulated model writes plain text ('text')",
                           f" {self.response_format.type!r}")  # fmt: skip
        return super().unsupported()


class CompletionRequest(_Common, kw_only=True):
    # OpenAI's four forms: a string, strings, token ids, lists of token ids (one prompt each).
    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompt_input(self) -> str | list[int]:
        """The one prompt, as text or as token ids; a ValueError says what is wrong with it."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if not p:
            raise ValueError("the prompt is an empty list")
        if all(type(x) is int for x in p):
            return _token_ids(p)  # type: ignore[arg-type]
        if any(type(x) is int for x in p):
            raise ValueError("the prompt mixes token ids with strings or lists")
        if len(p) != 1:
            raise ValueError(f"exactly one prompt per request, got {len(p)}")
        return p[0] if isinstance(p[0], str) else _token_ids(p[0])  # type: ignore[arg-type]

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs:
            return _refuse("logprobs", NO_PROBS)
        if self.best_of is not None and self.best_of > 1:
            return _refuse("best_of", "one completion a request", f" {self.best_of}")
        if self.suffix:
            return _refuse("suffix", "no fill-in-the-middle")
        return super().unsupported()


def _token_ids(ids: list[int]) -> list[int]:
    if not ids:
        raise ValueError("the prompt is an empty list of token ids")
    bad = next((t for t in ids if not 0 <= t < MAX_TOKEN_ID), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside 0..{MAX_TOKEN_ID - 1}")
    return ids


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def route_error_body(status: int, detail: object) -> dict[str, Any]:
    """A routing error (no such path: 404, a method the path does not take: 405) in OpenAI's
    error shape, for the API's and the admin API's exception handlers alike."""
    return error_body(str(detail), "not_found_error" if status == 404 else "invalid_request_error",
                      None, str(status))  # fmt: skip


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
