"""The decisions a run made, as comparable records with ids (issue 32 §1's first difference, §2's
fork at a decision).

A decision is an event by which an actor chose among alternatives: the gateway's JE draw
(`GatewayRouted`), a JE's routing of a task (`RouteDecided`; `RouteQueued`: chose, then held back),
the cluster manager declaring a TE failed (`TeDeclaredFailed`) or changing a group's target
(`GroupTarget`, a scaling action). `choice` is what was chosen, `about` what it was about; two
runs part at the first decision of an actor whose (about, choice) differ — compared per actor,
in its own delivery order, so that two actors interleaving differently (a daemon's wall clock)
is not a difference, and reported at the earliest time over the actors.

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


class Comparer:
    """Fed the what-if's decisions as they are made, compares each with the original's decision
    at the same position of the same actor; keeps the first difference per actor."""

    def __init__(self, original: dict[str, list[Decision]]) -> None:
        self.original = original
        self.pos: dict[str, int] = {}
        self.parted: dict[str, FirstDifference] = {}

    def add(self, d: Decision) -> None:
        if d.actor in self.parted:
            return
        i = self.pos.get(d.actor, 0)
        self.pos[d.actor] = i + 1
        theirs = self.original.get(d.actor, [])
        o = theirs[i] if i < len(theirs) else None
        if o is not None and o.kind == d.kind and o.about == d.about and o.choice == d.choice:
            return
        self.parted[d.actor] = FirstDifference(
            t=d.t if o is None else min(o.t, d.t), actor=d.actor, about=d.about if o is None else o.about,
            original="(none)" if o is None else _said(o), whatif=_said(d),
            original_t=None if o is None else o.t, whatif_t=d.t, index=i)  # fmt: skip

    def first(self) -> FirstDifference | None:
        """The earliest difference; an actor whose original went on deciding after the what-if
        stopped counts too (the what-if made no such decision)."""
        found = list(self.parted.values())
        for actor, theirs in self.original.items():
            i = self.pos.get(actor, 0)
            if actor not in self.parted and i < len(theirs):
                o = theirs[i]
                found.append(FirstDifference(t=o.t, actor=actor, about=o.about, original=_said(o), whatif="(none)",
                                             original_t=o.t, index=i))  # fmt: skip
        return min(found, key=lambda f: (f.t, f.actor)) if found else None


def _said(d: Decision) -> str:
    if d.kind in ("RouteDecided", "RouteQueued"):
        return f"{d.about} -> {d.choice}" if d.kind == "RouteDecided" else f"{d.choice} (queued)"
    if d.kind == "GatewayRouted":
        return f"{d.about} -> {d.choice}"
    return d.choice
