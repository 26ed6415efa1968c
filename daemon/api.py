"""OpenAI-compatible request bodies (msgspec: an error names the field) and response shapes.

Every field of OpenAI's and vLLM's current request bodies is declared here and is in exactly one
of three kinds (README, "Request fields"; tests/daemon/test_openai_compat.py checks the table):
honoured (HONOURED), accepted and documented as changing nothing here (NO_OP), or refused with a
400 saying why unless it has its neutral value (REFUSED). Any other field is a 400 (a typo is
caught), or, with `daemon.unknown_fields = "warn"`, dropped with one warning per field name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Temp = Annotated[float, msgspec.Meta(ge=0, le=2)]
TopP = Annotated[float, msgspec.Meta(gt=0, le=1)]
MaxTok = Annotated[int, msgspec.Meta(ge=1)]
NonNeg = Annotated[int, msgspec.Meta(ge=0)]
Seed = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
Penalty = Annotated[float, msgspec.Meta(ge=-2, le=2)]  # OpenAI's range
# vLLM's sampling extensions, with vLLM's ranges (-1 or 0: top_k off)
TopK = Annotated[int, msgspec.Meta(ge=-1, le=1 << 20)]
MinP = Annotated[float, msgspec.Meta(ge=0, le=1)]
RepetitionPenalty = Annotated[float, msgspec.Meta(gt=0, le=100)]
MAX_N = 16  # choices a request (each is its own emulated request on the cluster)
MAX_N_OPT = Annotated[int, msgspec.Meta(ge=1, le=MAX_N)]
MAX_STOPS = 4  # OpenAI's limit
MAX_MESSAGES = 4096
MAX_TOKEN_ID = 1 << 32  # token ids in a prompt: any vocabulary's ids fit
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=MAX_TOKEN_ID)]


class TextPart(msgspec.Struct, tag="text", tag_field="type", forbid_unknown_fields=True):
    """A content part. Only text: any other `type` (image_url, input_audio, file) is a
    400 naming `messages[i].content[j].type`, since the emulated model reads no media."""

    text: str
    # OpenAI's explicit cache breakpoint (no-op: the prefix cache matches whole KV blocks)
    prompt_cache_breakpoint: dict[str, Any] | None = None


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
    reasoning_content: str | None = None  # vLLM's, in a turn sent back

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
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM's: usage so far in every chunk
    include_obfuscation: bool | None = None  # no-op: nothing to pad (a loopback-grade daemon)


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: str
    json_schema: Any = None


NO_PROBS = "deepserve's emulated model has no token probabilities"
NO_TOOLS = "deepserve's emulated model does not call functions"
NO_STRUCTURE = "deepserve's emulated model writes plain text, it cannot follow a grammar or schema"
NO_HISTORY = "the emulated model's tokens do not depend on what came before"
NO_BEAMS = "deepserve samples each choice on its own: no beam search, no best-of ranking (one completion per choice)"

# Fields each route honours (README "Request fields"; http.py and generation.py give them effect).
HONOURED = (
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "include_stop_str_in_output", "stream",
    "stream_options", "n", "ignore_eos", "min_tokens", "echo", "truncate_prompt_tokens", "cache_salt",
)  # fmt: skip
# Accepted, and changing nothing here, with why.
NO_OP = {
    "user": "an end-user id for OpenAI's abuse monitoring; nothing to monitor",
    "safety_identifier": "OpenAI's replacement of `user`; nothing to monitor",
    "prompt_cache_key": "OpenAI's cache-routing hint; the JE routes by `scheduling.policy` (prefix-aware ones match prompts)",
    "prompt_cache_retention": "the prefix cache keeps blocks by LRU, not by request",
    "prompt_cache_options": "the prefix cache matches whole KV blocks and keeps them by LRU (a text part's `prompt_cache_breakpoint` is a no-op too)",
    "metadata": "stored completions' tags; nothing is stored",
    "store": "nothing is stored",
    "service_tier": "one tier",
    "priority": "vLLM's priority scheduling; the TE schedules first come, first served",
    "request_id": "vLLM's own id for the request; deepserve's is in `X-Request-Id`",
    "skip_special_tokens": "the emulated output has no special tokens",
    "spaces_between_special_tokens": "the emulated output has no special tokens",
    "add_special_tokens": "the prompt tokenizer adds none",
    "add_generation_prompt": "the plain chat template always ends with the assistant's turn",
    "chat_template_kwargs": "the plain chat template takes no arguments",
    "mm_processor_kwargs": "no media is read",
    "reasoning_effort": "the emulated model does not reason",
    "include_reasoning": "the emulated model does not reason",
    "verbosity": "the emulated output length follows the configured length model",
    "prediction": "predicted outputs only change latency; the emulated model's pace is the NPU model's",
    "modalities": "text only (`[\"text\"]`; audio is refused by `audio`)",
    "parallel_tool_calls": "no tools are called",
    "length_penalty": "only weighs beams; there is no beam search",
    "return_tokens_as_token_ids": "changes how logprobs print; there are none",
    "guided_decoding_backend": "no guided decoding (the guided_* fields are refused)",
    "guided_whitespace_pattern": "no guided decoding (the guided_* fields are refused)",
}
# Refused unless neutral (None, false, empty, or the value in NEUTRAL), with why.
REFUSED = {
    "logprobs": NO_PROBS, "top_logprobs": NO_PROBS, "logit_bias": NO_PROBS, "prompt_logprobs": NO_PROBS,
    "tools": NO_TOOLS, "functions": NO_TOOLS, "tool_choice": NO_TOOLS, "function_call": NO_TOOLS,
    "response_format": NO_STRUCTURE, "structured_outputs": NO_STRUCTURE, "guided_json": NO_STRUCTURE,
    "guided_regex": NO_STRUCTURE, "guided_choice": NO_STRUCTURE, "guided_grammar": NO_STRUCTURE,
    "structural_tag": NO_STRUCTURE,
    "presence_penalty": NO_HISTORY, "frequency_penalty": NO_HISTORY, "repetition_penalty": NO_HISTORY,
    "bad_words": NO_HISTORY,
    "best_of": NO_BEAMS, "use_beam_search": NO_BEAMS,
    "suffix": "no fill-in-the-middle",
    "allowed_token_ids": "the emulated model's vocabulary cannot be restricted",
    "logits_processors": "the emulated model has no logits to process",
    "audio": "deepserve's emulated model writes text only",
    "web_search_options": "deepserve's emulated model does not search the web",
    "moderation": "deepserve does not moderate",
    "documents": "the plain chat template reads no documents",
    "chat_template": "deepserve's chat template is fixed (adapters/tokenizer.py chat_text)",
    "continue_final_message": "the plain chat template always opens a new assistant turn",
    "return_token_ids": "the response carries text only",
    "prompt_embeds": "prompts are text or token ids",
    "kv_transfer_params": "P/D transfer is deepserve's own (the [pd] pool), not the client's",
    "vllm_xargs": "no vLLM extension arguments",
}
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "repetition_penalty": (1, 1.0),
    "tool_choice": ("none", "auto"), "function_call": ("none", "auto"), "best_of": (1,),
}  # fmt: skip


def _refusable(cls: type) -> tuple[str, ...]:
    """A request class's REFUSED fields, in declaration order (the order `_refusal` reports in)."""
    fields = _REFUSABLE.get(cls)
    if fields is None:
        fields = _REFUSABLE[cls] = tuple(f for f in cls.__struct_fields__ if f in REFUSED)  # type: ignore[attr-defined]
    return fields


_REFUSABLE: dict[type, tuple[str, ...]] = {}


def _refusal(req: msgspec.Struct) -> tuple[str, str] | None:
    """(field, message) for the first field asking what deepserve cannot do (only the REFUSED
    fields are read: a walk over all ~70 was ~1 % of the daemon's CPU under load)."""
    for field in _refusable(type(req)):
        value = getattr(req, field)
        # falsy: None, false, 0, "", [], {} (what `in (None, False, "", [], {})` matched, 0 == False)
        if not value or value in NEUTRAL.get(field, ()):
            continue
        why = REFUSED[field]
        if (field == "response_format" and value.type == "text") or (field == "best_of" and value == getattr(req, "n", None)):
            continue
        shown = value.type if field == "response_format" else value
        text = repr(shown) if isinstance(shown, (str, int, float)) and not isinstance(shown, bool) else ""
        return field, f"`{field}`{' ' + text if text else ''} is not supported: {why}"
    return None


class _Common(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    max_tokens: MaxTok | None = None
    temperature: Temp | None = None
    top_p: TopP | None = None
    stop: str | list[str] | None = None
    seed: Seed | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: MAX_N_OPT | None = None
    # vLLM's extensions, honoured
    ignore_eos: bool = False  # run to max_tokens
    top_k: TopK | None = None
    min_p: MinP | None = None
    min_tokens: NonNeg = 0
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    cache_salt: str | None = None
    # NO_OP
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    priority: int = 0
    request_id: str | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    add_special_tokens: bool | None = None
    length_penalty: float = 1.0
    return_tokens_as_token_ids: bool | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    # REFUSED unless neutral
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, float] | None = None
    prompt_logprobs: int | None = None
    best_of: int | None = None
    use_beam_search: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logits_processors: list[Any] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    return_token_ids: bool | None = None
    kv_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, Any] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > MAX_STOPS:
            raise msgspec.ValidationError(f"at most {MAX_STOPS} stop sequences - at `$.stop`")
        return [s for s in stops if s]

    def choices(self) -> int:
        return self.n or 1

    def unsupported(self) -> tuple[str, str] | None:
        """(field, message) for the first field asking what deepserve cannot do."""
        refused = _refusal(self)
        if refused is not None:
            return refused
        if self.stream_options is not None and not self.stream:
            return "stream_options", "`stream_options` is only allowed when `stream` is true"
        return None


class ChatRequest(_Common, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: MaxTok | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    include_reasoning: bool | None = None
    verbosity: str | None = None
    prediction: dict[str, Any] | None = None
    modalities: list[str] | None = None
    parallel_tool_calls: bool | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    tool_choice: Any = None
    function_call: Any = None
    structural_tag: str | None = None
    audio: dict[str, Any] | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: Any = None
    documents: list[Any] | None = None
    chat_template: str | None = None
    continue_final_message: bool = False
    echo: bool = False  # vLLM's: the reply starts with the last message's content (an assistant's)


class CompletionRequest(_Common, kw_only=True):
    # OpenAI's four forms: a string, strings, token ids, lists of token ids (one prompt each).
    prompt: str | list[str | int | list[int]]
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    prompt_embeds: Any = None

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


def _token_ids(ids: list[int]) -> list[int]:
    if not ids:
        raise ValueError("the prompt is an empty list of token ids")
    bad = next((t for t in ids if not 0 <= t < MAX_TOKEN_ID), None)
    if bad is not None:
        raise ValueError(f"token id {bad} is outside 0..{MAX_TOKEN_ID - 1}")
    return ids


# OpenAI's `code` of an error a status stands for, where the raise site names none.
CODE_OF_STATUS = {
    400: "invalid_value", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
    422: "invalid_value", 429: "rate_limit_exceeded", 500: "internal_error", 503: "service_unavailable",
    504: "timeout",
}  # fmt: skip


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def route_error_body(status: int, detail: object) -> dict[str, Any]:
    """A routing error (no such path: 404, a method the path does not take: 405) in OpenAI's
    error shape, for the API's and the admin API's exception handlers alike."""
    return error_body(str(detail), "not_found_error" if status == 404 else "invalid_request_error",
                      None, CODE_OF_STATUS.get(status, "invalid_request"))  # fmt: skip


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
