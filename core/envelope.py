"""The envelope every delivered message travels in."""

from __future__ import annotations

from typing import Any


class Envelope:
    """Routing facts around one message.

    `msg_id` is unique per sender (its output counter), so (src, msg_id) names a
    message across the run. `reply_to` names the request this message answers;
    `ask` asks the kernel to answer with `AskFailed` if delivery fails.
    `payload` caches the msgpack encoding so a logged message is encoded once.

    A plain class: compiled (compiled.py), its fields are C struct members that the
    drivers read directly, where a msgspec Struct's are found by name (~160 instructions a
    read, several a delivery). It never crosses a process as itself: the transport sends a
    `Wire` struct (transport.py) and the log an `InputRec`.
    """

    __slots__ = ("src", "dst", "msg_id", "hlc", "corr", "msg", "reply_to", "ask", "external", "payload")

    def __init__(
        self, src: str, dst: str, msg_id: int, hlc: int, corr: str | None, msg: Any,
        reply_to: int | None = None, ask: bool = False, external: bool = False,
        payload: bytes | None = None,
    ) -> None:
        self.src = src
        self.dst = dst
        self.msg_id = msg_id
        self.hlc = hlc
        self.corr = corr
        self.msg = msg
        self.reply_to = reply_to
        self.ask = ask
        self.external = external
        self.payload = payload

    def __repr__(self) -> str:
        return (f"Envelope({self.src!r} -> {self.dst!r}, msg_id={self.msg_id}, "
                f"reply_to={self.reply_to}, msg={self.msg!r})")
