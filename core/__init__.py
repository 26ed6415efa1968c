"""The actor kernel: messages, actors, contexts, drivers, supervision. No LLM knowledge."""

from .actor import Actor, Directive, Supervision
from .address import address, deterministic_id
from .asyncdriver import AsyncDriver
from .codec import decode, encode
from .context import Context
from .driver import AskError
from .envelope import Envelope, ReplyHandle
from .messages import (
    AskFailed,
    ChildFailed,
    Event,
    HandlerFailed,
    Message,
    Raw,
    Restarted,
    Started,
    Stopped,
)
from .records import LogSink, MemorySink, Step
from .sim import SimDriver

__all__ = [
    "Actor", "AskError", "AskFailed", "AsyncDriver", "ChildFailed", "Context", "Directive", "Envelope", "Event",
    "HandlerFailed", "LogSink", "MemorySink", "Message", "Raw", "ReplyHandle", "Restarted", "SimDriver",
    "Started", "Step", "Stopped", "Supervision", "address", "decode", "deterministic_id", "encode",
]
