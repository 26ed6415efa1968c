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
    resubmit: Resubmit | None = None  # non-streaming jobs: resent if their JE is lost


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


class Resubmit(msgspec.Struct, frozen=True, kw_only=True):
    """What a job needs to be sent again to another JE: kept for a job whose client does not
    stream, and (`GatewayConfig.migrate_streams`) for a streaming one too — the new JE resumes
    it at its client's position; without, a streaming one that lost its JE fails."""

    prompt: Prompt
    sampling: Sampling
    predicted_bucket: int | None = None
    stream: bool = False


class Client(msgspec.Struct, kw_only=True):
    model: str
    reply_to: str
    je: str
    arrival_s: float = 0.0
    resubmit: Resubmit | None = None
    epoch: int = 0  # times it moved to another JE (JobRequest.epoch)


class JeLost(Message, frozen=True, kw_only=True):
    """A fault (a scenario's `kill-je`, injected with the JE's `Stop`): the JE's process died and
    the gateway's connection to it broke, so the gateway knows at once, as a reset connection
    tells it. Its jobs go to another JE (not streaming) or fail with the reason (streaming)."""

    je: str
    reason: str = "crashed"


class GatewayJeDown(Event, frozen=True, kw_only=True):
    """The gateway no longer draws `je`; `retried` went to another JE, `failed` failed."""

    je: str
    reason: str
    retried: tuple[tuple[str, str], ...]  # (request id, the JE it now runs on)
    failed: tuple[str, ...]


class GatewayState(msgspec.Struct, kw_only=True):
    inflight: dict[str, int] = {}  # model -> requests admitted and not yet terminal
    clients: dict[str, Client] = {}  # request id -> where its answer goes
    arrived: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    duplicates: int = 0
    refused: int = 0
    down: list[str] = []  # JEs lost (a crash): no longer drawn
    je_retried: int = 0  # jobs sent to another JE after theirs was lost
    last_arrival_s: float = -1.0  # the last admitted request's arrival (-1: none yet)
