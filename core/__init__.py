"""The actor kernel: messages, actors, contexts, drivers, supervision. No LLM knowledge.

The public API for embedding actors in one's own program; see docs/kernel.md."""

from deepserve import BUILD as KERNEL_BUILD  # compiled or pure (deepserve/compiled.py)

from .actor import Actor, Directive, MissingEvolve, Supervision
from .address import address, deterministic_id
from .asyncdriver import AsyncDriver, run
from .classpath import UnknownActorClass
from .codec import DecodeError, decode, encode
from .context import Context
from .driver import AskError
from .envelope import Envelope
from .messages import (
    AskFailed,
    ChildFailed,
    Event,
    HandlerFailed,
    Message,
    Raw,
    ReplyHandle,
    Restarted,
    Started,
    Stopped,
    Undelivered,
)
from .records import DurableSink, InputKind, LogSink, MemorySink, OutputKind, RunRec, Step
from .sim import SimDriver
from .transport import InProcHub, Transport

__all__ = [
    "KERNEL_BUILD", "Actor", "AskError", "AskFailed", "AsyncDriver", "ChildFailed", "Context", "DecodeError",
    "Directive", "DurableSink", "Envelope", "Event", "HandlerFailed", "InProcHub", "InputKind",
    "LogSink", "MemorySink", "Message", "MissingEvolve", "OutputKind", "Raw", "ReplyHandle",
    "Restarted", "RunRec", "SimDriver", "Started", "Step", "Stopped", "Supervision", "Transport",
    "Undelivered", "UnknownActorClass", "address", "decode", "deterministic_id", "encode", "run",
]
