"""What the workload actor receives from the outside and records about each request."""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.actors.flowserve.messages import KvHandle, Prompt, Sampling
from deepserve.core.messages import Event, Message

RequestStatus = Literal["completed", "failed", "cancelled"]
METRICS_ADDR = "ext/metrics"  # where each terminal request is reported (the run's collector)


class Arrive(Message, frozen=True, kw_only=True):
    """A client request entering the platform (an external input at its trace time)."""

    request_id: str
    model: str
    prompt: Prompt
    sampling: Sampling
    # False: the client gets its output in one body at the end (HTTP `stream: false`), so a task
    # that failed after producing tokens is still retried from scratch (nothing was shown)
    stream: bool = True


class EndOfRun(Message, frozen=True, kw_only=True):
    """The run is over: whatever is still pending ends now as failed, with this reason."""

    reason: str = "the run ended before the request finished"


class RequestDone(Message, frozen=True, kw_only=True, omit_defaults=True):
    """One request's terminal state, as the metrics collector sees it. Recorded once a request:
    its fields at their defaults are left out of the log (`omit_defaults`)."""

    request_id: str
    status: RequestStatus
    reason: str
    arrival_s: float
    first_token_s: float | None
    finish_s: float
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    te: str  # the TE that produced the output (the decode TE in PD mode)
    preemptions: int = 0  # of the task that finished it (KV blocks ran out: recomputed or swapped)
    # The request's first task (PD: the prefill) on its DP master: queued, first scheduled
    # (vLLM's QUEUED and SCHEDULED; None: never scheduled, or not told — the simulator's)
    queued_s: float | None = None
    scheduled_s: float | None = None


# ---- events --------------------------------------------------------------------------------


class RequestDispatched(Event, frozen=True, kw_only=True):
    """A task of `request_id` was sent to `te` (phase: chat, prefill or decode)."""

    request_id: str
    phase: Literal["chat", "prefill", "decode"]
    te: str
    arrival_s: float
    attempt: int = 1
    # PD: what the decode task needs again after the prefill (kept only in PD mode).
    prompt: Prompt | None = None
    sampling: Sampling | None = None
    model: str = ""


class RequestPrefilled(Event, frozen=True, kw_only=True):
    """PD: the prefill finished with its first token and a registered KV transfer."""

    request_id: str
    first_token_s: float | None
    cached_prompt_tokens: int
    kv: KvHandle


class RequestFinished(Event, frozen=True, kw_only=True):
    """The request's one terminal state."""

    done: RequestDone


class LateTaskTerminal(Event, frozen=True, kw_only=True):
    """A terminal message for a task that is no longer current (the request already ended, or
    it belongs to an earlier attempt): counted, never a second terminal state."""

    task_id: str
    status: str
    reason: str


class WorkloadState(msgspec.Struct):
    rr: dict[str, int] = {}  # next index per role ("chat", "prefill", "decode")
    pending: dict[str, Pending] = {}
    arrived: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    duplicates: int = 0  # terminal messages for requests already terminal (ignored)


class Pending(msgspec.Struct):
    arrival_s: float
    phase: str
    te: str
    attempt: int = 1
    first_token_s: float | None = None
    cached_prompt_tokens: int = 0
    prompt: Prompt | None = None
    sampling: Sampling | None = None
    model: str = ""
