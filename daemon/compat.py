"""Request fields nobody declared, as `daemon.unknown_fields` says: "error" (the default: a 400
naming the field, so a typo such as `max_token` is caught) or "warn" (vLLM's behaviour: the field
is dropped and the daemon logs one warning per field name — not one per request)."""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from .api import ChatMessage, StreamOptions, TextPart

log = structlog.get_logger("deepserve.http")
MAX_WARNED = 1024  # distinct names remembered (a client inventing names cannot grow this)


def _fields(cls: type) -> frozenset[str]:
    names: tuple[str, ...] = getattr(cls, "__struct_encode_fields__", ())
    return frozenset(names)


_NESTED = {"messages": _fields(ChatMessage), "stream_options": _fields(StreamOptions)}
_PART = _fields(TextPart) | {"type"}


class UnknownFields:
    """Drops undeclared fields from a decoded body (warn mode), naming each path once in a warning."""

    def __init__(self) -> None:
        self.warned: set[str] = set()

    def strip(self, body: Any, cls: type) -> Any:
        if not isinstance(body, dict):
            return body  # not an object: msgspec's own error names it
        dropped = _drop(body, _fields(cls), "")
        messages = body.get("messages")
        if isinstance(messages, list):
            for i, m in enumerate(messages):
                if isinstance(m, dict):
                    dropped += _drop(m, _NESTED["messages"], f"messages[{i}].")
                    parts = m.get("content")
                    if isinstance(parts, list):
                        for j, part in enumerate(parts):
                            if isinstance(part, dict):
                                dropped += _drop(part, _PART, f"messages[{i}].content[{j}].")
        if isinstance(body.get("stream_options"), dict):
            dropped += _drop(body["stream_options"], _NESTED["stream_options"], "stream_options.")
        for path in dropped:
            name = _name_of(path)
            if name not in self.warned and len(self.warned) < MAX_WARNED:
                self.warned.add(name)
                log.warning("ignored an unknown request field (daemon.unknown_fields = \"warn\")", field=path)
        return body


def _drop(obj: dict[str, Any], known: frozenset[str], prefix: str) -> list[str]:
    unknown = [k for k in obj if k not in known]
    for k in unknown:
        del obj[k]
    return [prefix + k for k in unknown]


def _name_of(path: str) -> str:
    """`messages[3].nmae` → `messages[].nmae`: one warning per field, whichever message."""
    out, depth = [], 0
    for ch in path:
        if ch == "[":
            depth += 1
            out.append("[]")
        elif ch == "]":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def decode_lenient(raw: bytes, cls: type, unknown: UnknownFields) -> Any:
    """The body as `cls`, unknown fields dropped (raises msgspec's errors, as a strict decode)."""
    return msgspec.convert(unknown.strip(msgspec.json.decode(raw), cls), type=cls)
