"""The envelope every delivered message travels in."""

from __future__ import annotations

from typing import Any

import msgspec


class Envelope(msgspec.Struct, gc=False):
    """Routing facts around one message.

    `msg_id` is unique per sender (its output counter), so (src, msg_id) names a
    message across the run. `reply_to` names the request this message answers;
    `ask` asks the kernel to answer with `AskFailed` if delivery fails.
    `payload` caches the msgpack encoding so a logged message is encoded once.
    """

    src: str
    dst: str
    msg_id: int
    hlc: int
    corr: str | None
    msg: Any
    reply_to: int | None = None
    ask: bool = False
    external: bool = False
    payload: bytes | None = None


class ReplyHandle(msgspec.Struct, frozen=True, array_like=True):
    """Where, and to which message, a later answer goes (storable in actor state)."""

    addr: str
    msg_id: int
    corr: str | None = None
