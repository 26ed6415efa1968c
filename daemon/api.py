"""OpenAI-compatible request bodies (msgspec: an error names the field) and response shapes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Temp = Annotated[float, msgspec.Meta(ge=0, le=2)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
MaxTok = Annotated[int, msgspec.Meta(ge=1)]
Seed = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
MAX_STOPS = 4  # OpenAI's limit
MAX_MESSAGES = 4096


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str
    name: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Common(msgspec.Struct, kw_only=True):
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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > MAX_STOPS:
            raise msgspec.ValidationError(f"at most {MAX_STOPS} stop sequences - at `$.stop`")
        return [s for s in stops if s]


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str]
    echo: bool = False


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
