"""The gateway's messages and events."""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.core.messages import Event, Message

# How the reason of an `Arrive` the gateway refused starts (its failed `RequestDone`): the
# daemon's frontend answers such a request 429 with Retry-After (`is_refused`).
REFUSED_429 = "429 refused: "


def is_refused(status: str, reason: str) -> bool:
    """A terminal state that is the gateway's admission refusal (nothing ran)."""
    return status == "failed" and reason.startswith(REFUSED_429)


class ApiRequest(Message, frozen=True, kw_only=True):
    """An API request from the HTTP layer; the answer is one `RequestDone`, or `Refused`."""

    request_id: str
    model: str
    prompt: Prompt
    sampling: Sampling
    reply_to: str
    predicted_bucket: int | None = None
    stream: bool = True  # Arrive.stream


class Refused(Message, frozen=True, kw_only=True):
    """Admission control said no: the HTTP layer answers 429 with `Retry-After`."""

    request_id: str
    status: int = 429
    retry_after_s: float = 1.0
    reason: str = ""


class JeDraw(msgspec.Struct, frozen=True, kw_only=True):
    candidates: tuple[str, ...]
    draw: int  # index drawn from ctx.rng


class GatewayRouted(Event, frozen=True, kw_only=True):
    """A request became a job on `je` (xDeepServe §5.1 step 1: a JE at random)."""

    request_id: str
    model: str
    je: str
    reply_to: str
    arrival_s: float
    inflight: int  # the model's requests in flight, this one included
    limit: int
    draw: JeDraw


class GatewayRefused(Event, frozen=True, kw_only=True):
    request_id: str
    model: str
    inflight: int
    limit: int
    reason: str


class GatewayDuplicate(Event, frozen=True, kw_only=True):
    """An arrival whose request id is already in flight: counted, not admitted twice."""

    request_id: str


class GatewayDone(Event, frozen=True, kw_only=True):
    request_id: str
    status: str


class Client(msgspec.Struct, kw_only=True):
    model: str
    reply_to: str
    je: str


class GatewayState(msgspec.Struct, kw_only=True):
    inflight: dict[str, int] = {}  # model -> requests admitted and not yet terminal
    clients: dict[str, Client] = {}  # request id -> where its answer goes
    arrived: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    duplicates: int = 0
    refused: int = 0
