"""Messages and events: immutable msgspec Structs, registered by type name.

Every message an actor receives and every event it records is a frozen, tagged
Struct. Subclassing `Message` or `Event` registers the class under its name, so a
log written by one process decodes in another by type name alone (see `codec`).

Both are `gc=False`: the cyclic collector does not track them. They are frozen data (they
must encode to msgpack), so they cannot form a reference cycle, and an actor keeps every
event since its last snapshot for restarts (a DP master up to 8,192), all of which the
collector traversed again and again: on the whole Mooncake trace (one process, no log) its
time fell from 2.1 to 1.1 s of ~30 s (docs/decisions.md, 2026-11-26). A field holding a
mutable container stays tracked itself; only a cycle through the message would be missed.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

_REGISTRY: dict[str, type[msgspec.Struct]] = {}


class DuplicateTypeName(TypeError):
    """Two different classes claim the same type name in one process."""


def _check_fields(cls: type[msgspec.Struct]) -> None:
    """A field typed as the abstract base cannot be decoded from a log (msgpack
    needs the concrete type): refuse it when the class is defined, not at replay."""
    for name, hint in getattr(cls, "__annotations__", {}).items():
        if hint in ("Message", "Event", "Message | None", "Event | None") or hint in (Message, Event):
            raise TypeError(
                f"{cls.__name__}.{name}: a field typed as the base {hint!r} cannot be decoded; "
                f"use a concrete message type or a union of them"
            )


def _register(cls: type[msgspec.Struct]) -> None:
    _check_fields(cls)
    name = cls.__name__
    known = _REGISTRY.get(name)
    if known is not None and known is not cls:
        same_origin = (known.__module__, known.__qualname__) == (cls.__module__, cls.__qualname__)
        if not same_origin:
            raise DuplicateTypeName(
                f"type name {name!r} is used by {known.__module__}.{known.__qualname__} "
                f"and {cls.__module__}.{cls.__qualname__}; log records decode by name, "
                f"so names must be unique"
            )
    _REGISTRY[name] = cls


def registered(name: str) -> type[msgspec.Struct] | None:
    """The class registered under `name`, or None."""
    return _REGISTRY.get(name)


class Message(msgspec.Struct, frozen=True, tag=True, gc=False):
    """Base of every message an actor can receive."""

    # Messages the kernel itself defines are marked so tools can hide them.
    system: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register(cls)


class Event(msgspec.Struct, frozen=True, tag=True, gc=False):
    """Base of every domain event: one recorded state change of one actor."""

    system: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _register(cls)


class Raw(msgspec.Struct, frozen=True):
    """A record whose type is not known to this process: kept, never dropped."""

    type: str
    data: Any


# ---- kernel messages -------------------------------------------------------


class Started(Message, frozen=True):
    """First input of every actor: carries what is needed to rebuild it on replay."""

    system: ClassVar[bool] = True
    cls: str  # "module:QualName"
    args: dict[str, Any] = {}
    parent: str | None = None


class AskFailed(Message, frozen=True):
    """Reply to an `ask` that cannot be answered: target dead, mailbox full, timed out."""

    system: ClassVar[bool] = True
    request_id: int
    target: str
    reason: str


class Undelivered(Message, frozen=True):
    """Told to an actor whose tell was not delivered (the target had stopped or never
    existed, its mailbox was full, or the transport refused it): a message between
    actors is never lost silently. An asker gets `AskFailed` instead. Handle it to
    retry or give up; ignoring it is allowed."""

    system: ClassVar[bool] = True
    msg_id: int  # the sender's id of the dropped message (what `ctx.send` returned)
    target: str
    reason: str
    msg_type: str  # the dropped message's type name


class ChildFailed(Message, frozen=True):
    """Sent to a parent whose child escalated a handler failure."""

    system: ClassVar[bool] = True
    child: str
    error: str


# ---- kernel events ---------------------------------------------------------


class HandlerFailed(Event, frozen=True):
    """A handler raised; its events and outputs for that input were discarded."""

    system: ClassVar[bool] = True
    error: str  # "ExcType: message" — compared on replay
    traceback: str = ""  # file paths differ between machines: excluded from digests


class Restarted(Event, frozen=True):
    system: ClassVar[bool] = True
    restarts: int


class Stopped(Event, frozen=True):
    system: ClassVar[bool] = True
    reason: str


class Stop(Message, frozen=True):
    """Asks the kernel to stop the receiving actor (sent by `ctx.stop(addr)`)."""

    system: ClassVar[bool] = True
    by: str


class ReplyHandle(msgspec.Struct, frozen=True, array_like=True):
    """Where, and to which message, a later answer goes (storable in actor state)."""

    addr: str
    msg_id: int
    corr: str | None = None
