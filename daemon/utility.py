"""vLLM's utility endpoints, with vLLM's request and response shapes: `/version`, `/ping`
(GET or POST: 200 while serving, 503 while stopping), `/tokenize` (a prompt, or chat messages
through the chat template) and `/detokenize`, over the daemon's tokenizer (adapters/tokenizer.py)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from deepserve.adapters.tokenizer import chat_text

from .api import MAX_MESSAGES, ChatMessage, TokenId

if TYPE_CHECKING:
    from .http import Frontend


class TokenizeCompletionRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True  # no-op: the tokenizer adds none
    return_token_strs: bool | None = False


class TokenizeChatRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)]
    model: str | None = None
    add_generation_prompt: bool = True  # no-op: the plain template always opens the reply
    return_token_strs: bool | None = False
    continue_final_message: bool = False  # refused when true, as in a chat request
    add_special_tokens: bool = False
    chat_template: str | None = None  # refused unless null
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[Any] | None = None  # refused unless empty


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    tokens: list[TokenId]
    model: str | None = None


def deepserve_version() -> str:
    try:
        return version("deepserve")
    except PackageNotFoundError:  # run from a checkout without an install
        return "0+unknown"


def _refused(req: TokenizeChatRequest) -> tuple[str, str] | None:
    if req.continue_final_message:
        return "continue_final_message", "the plain chat template always opens a new assistant turn"
    if req.chat_template is not None:
        return "chat_template", "deepserve's chat template is fixed"
    if req.tools:
        return "tools", "deepserve's emulated model does not call functions"
    return None


async def tokenize(fe: Frontend, raw: bytes) -> dict[str, Any]:
    """vLLM's /tokenize: {count, max_model_len, tokens, token_strs}."""
    from .http import HttpError

    chat = _has_messages(raw)
    req: Any = fe.decode(raw, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    fe.check_model(req.model)
    if chat:
        refused = _refused(req)
        if refused is not None:
            raise HttpError(400, f"`{refused[0]}` is not supported: {refused[1]}", "invalid_request_error",
                            refused[0], code="unsupported_parameter")  # fmt: skip
        text = chat_text([{"role": m.role, "content": m.text()} for m in req.messages])
    else:
        text = req.prompt
    try:
        ids = fe.tokenizer.encode(text)
    except ValueError as exc:
        raise HttpError(400, str(exc), "invalid_request_error", "messages" if chat else "prompt") from None
    strs = [fe.tokenizer.decode([t]) for t in ids] if req.return_token_strs else None
    return {"count": len(ids), "max_model_len": fe.cfg.max_prompt_tokens, "tokens": ids, "token_strs": strs}


async def detokenize(fe: Frontend, raw: bytes) -> dict[str, Any]:
    """vLLM's /detokenize: {prompt}."""
    req: DetokenizeRequest = fe.decode(raw, DetokenizeRequest)
    fe.check_model(req.model)
    return {"prompt": fe.tokenizer.decode(req.tokens)}


def _has_messages(raw: bytes) -> bool:
    """Which of vLLM's two /tokenize bodies this is (the chat form has `messages`)."""
    try:
        body = msgspec.json.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return False  # the strict decode that follows names the problem
    return isinstance(body, dict) and "messages" in body
