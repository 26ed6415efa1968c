"""The decisions a run made, as comparable records with ids (issue 32 §1's first difference, §2's
fork at a decision).

A decision is an event by which an actor chose among alternatives: the gateway's JE draw
(`GatewayRouted`), a JE's routing of a task (`RouteDecided`; `RouteQueued`: chose, then held back),
the cluster manager declaring a TE failed (`TeDeclaredFailed`) or changing a group's target
(`GroupTarget`, a scaling action). `choice` is what was chosen, `about` what it was about; two
runs part at the first decision the what-if makes (in its time order) that differs in (about,
choice) from the original's at the same position of the same actor — compared per actor, so that
two actors interleaving differently (a daemon's wall clock) is not a difference. A logged decision
is decoded only when compared: a change that parts at once costs no decoding of the rest.

A routing decision's id is its task id (`r12/chat.1`: request, phase, attempt — one id a task;
`replay why` shows it): what `replay whatif --at-decision ID` names.
"""

from __future__ import annotations

from typing import Any

import msgspec

DECISION_TYPES = frozenset({"GatewayRouted", "RouteDecided", "RouteQueued", "TeDeclaredFailed", "GroupTarget"})
ROUTING_TYPES = ("RouteDecided",)


class Decision(msgspec.Struct, frozen=True, array_like=True):
    t: float
    actor: str
    seq: int
    kind: str  # the event type
    about: str  # what was decided on: a request, a task, a TE, a group
    choice: str  # what was chosen
    id: str = ""  # a routing decision's id (its task id); "" for the others
    candidates: tuple[str, ...] = ()  # a routing decision's ranked TEs of the chosen subgroup, best first


def decision_of(actor: str, seq: int, _idx: int, t: float, kind: str, ev: Any) -> Decision:
    """The comparable record of one decision event (`kind` in DECISION_TYPES)."""
    if kind == "GatewayRouted":
        return Decision(t, actor, seq, kind, ev.request_id, ev.je)
    if kind in ("RouteDecided", "RouteQueued"):
        d = ev.decision
        about = ev.task_id if kind == "RouteDecided" else f"{ev.request_id} (queued)"
        ranked = tuple(r.te for r in d.ranked if r.subgroup == d.subgroup)  # another subgroup: another phase
        return Decision(t, actor, seq, kind, about, d.chosen, ev.task_id if kind == "RouteDecided" else "", ranked)
    if kind == "TeDeclaredFailed":
        return Decision(t, actor, seq, kind, f"{ev.te} generation {ev.generation}", f"declared failed ({ev.diagnosis or ev.reason})")
    return Decision(t, actor, seq, kind, f"group {ev.group}", f"target {ev.size}")


class FirstDifference(msgspec.Struct, kw_only=True):
    """Where two runs part: the earliest decision (over the actors) the two made differently."""

    t: float
    actor: str
    about: str
    original: str  # what the original chose ("(none)": it made no further decision)
    whatif: str
    original_t: float | None = None
    whatif_t: float | None = None
    index: int = 0  # the decision's position in the actor's sequence


class Pending(msgspec.Struct, frozen=True, array_like=True):
    """A logged decision event not decoded yet: a what-if decodes only as far as the runs agree."""

    t: float
    actor: str
    seq: int
    kind: str
    payload: bytes


class Comparer:
    """Fed the what-if's decisions in its time order, compares each with the original's at the
    same position of the same actor. The first that differs is where the runs part (`done`:
    nothing later can be earlier in the what-if's order, so the tap can stop)."""

    def __init__(self, original: dict[str, list[Pending]]) -> None:
        self.original = original
        self.pos: dict[str, int] = {}
        self.parted: FirstDifference | None = None
        self.done = False

    def add(self, d: Decision) -> None:
        if self.done:
            return
        i = self.pos.get(d.actor, 0)
        self.pos[d.actor] = i + 1
        theirs = self.original.get(d.actor, [])
        o = decoded(theirs[i]) if i < len(theirs) else None
        if o is not None and o.kind == d.kind and o.about == d.about and o.choice == d.choice:
            return
        self.parted = FirstDifference(
            t=d.t, actor=d.actor, about=d.about if o is None else o.about,
            original="(none)" if o is None else _said(o), whatif=_said(d),
            original_t=None if o is None else o.t, whatif_t=d.t, index=i)  # fmt: skip
        self.done = True

    def first(self) -> FirstDifference | None:
        """Where the runs part; if every decision the what-if made was the original's, the earliest
        decision the original made beyond them (the what-if made no such decision)."""
        if self.parted is not None:
            return self.parted
        left = [(theirs[i], i) for actor, theirs in self.original.items() if (i := self.pos.get(actor, 0)) < len(theirs)]
        if not left:
            return None
        p, i = min(left, key=lambda x: (x[0].t, x[0].actor))
        o = decoded(p)
        return FirstDifference(t=o.t, actor=o.actor, about=o.about, original=_said(o), whatif="(none)",
                               original_t=o.t, index=i)  # fmt: skip


def decoded(p: Pending) -> Decision:
    from deepserve.core.codec import decode

    return decision_of(p.actor, p.seq, 0, p.t, p.kind, decode(p.kind, p.payload))


def _said(d: Decision) -> str:
    if d.kind in ("RouteDecided", "RouteQueued"):
        return f"{d.about} -> {d.choice}" if d.kind == "RouteDecided" else f"{d.choice} (queued)"
    if d.kind == "GatewayRouted":
        return f"{d.about} -> {d.choice}"
    return d.choice
