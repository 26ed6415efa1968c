"""The autoscaler's messages and recorded events (issue 34 §5), and the manager's role flip."""

from __future__ import annotations

from deepserve.core.messages import Event, Message


class AutoscaleTick(Message, frozen=True, kw_only=True):
    """The autoscaler's own timer: one decision round."""


class RequestSeen(Message, frozen=True, kw_only=True):
    """The gateway's word that a request of `model` arrived (its `observer`): the demand that
    brings a model scaled to zero back, and the in-flight count."""

    request_id: str
    model: str


class FlipTe(Message, frozen=True, kw_only=True):
    """To the cluster manager: move a ready TE from group `src` to group `dst` of the same model
    (role switching, P/D ratio) — membership only, the TE keeps its weights and its open tasks."""

    te: str
    src: str
    dst: str
    reason: str


class TeRoleFlipped(Event, frozen=True, kw_only=True):
    """The manager moved a ready TE between its model's groups (no reload)."""

    te: str
    src: str
    dst: str
    reason: str
    at_s: float


class FlipRefused(Event, frozen=True, kw_only=True):
    te: str
    dst: str
    reason: str


# ---- the autoscaler's own events ---------------------------------------------------------------------


class MembersSeen(Event, frozen=True, kw_only=True):
    group: str
    model: str
    role: str
    tes: tuple[str, ...]


class LoadSampled(Event, frozen=True, kw_only=True):
    te: str
    dp: int
    waiting: int
    running: int
    prefill_tokens_waiting: int


class ArrivalSeen(Event, frozen=True, kw_only=True):
    request_id: str
    model: str
    at_s: float


class AnswerSeen(Event, frozen=True, kw_only=True):
    """A request answered: its TTFT and E2E and whether it met the SLO (into the window)."""

    request_id: str
    ttft_ms: float
    e2e_ms: float
    attained: bool
    at_s: float


class WindowRolled(Event, frozen=True, kw_only=True):
    at_s: float


class AutoscaleDecided(Event, frozen=True, kw_only=True):
    """One decision of a policy; `advisory`: recorded only, not carried out."""

    policy: str
    kind: str  # "scale" | "flip"
    group: str  # the group scaled, or the group a flipped TE joins
    size: int  # scale: the new target; flip: 0
    te: str  # flip: the TE; scale: ""
    src: str  # flip: the group it leaves
    reason: str
    advisory: bool
    at_s: float
