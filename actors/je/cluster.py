"""A cluster-manager stand-in: TEs register (`RegisterTe`, sent by the TE shell at start), the
manager groups them by (model, role) and pushes each group's membership to every JE — at once,
on every change (DeepServe Table 2: proactive pushing, no polling lag). `RemoveTe` (an operator
or fault input) drops a TE and pushes again. The daemon issue builds the real manager."""

from __future__ import annotations

from deepserve.actors.flowserve.messages import RegisterTe
from deepserve.core import Actor, Context, Event, Message

from .messages import TeGroupMembership


class RemoveTe(Message, frozen=True, kw_only=True):
    te: str
    reason: str = "removed by the operator"


class TeJoined(Event, frozen=True, kw_only=True):
    te: str
    model: str
    role: str


class TeLeft(Event, frozen=True, kw_only=True):
    te: str
    reason: str


class ClusterManager(Actor[dict]):
    def __init__(self, jes: list[str]) -> None:
        self.jes = list(jes)

    def initial_state(self) -> dict:
        return {"tes": {}, "version": 0}  # te -> [model, role]

    def evolve(self, s: dict, e: Event) -> dict:
        if isinstance(e, TeJoined):
            s["tes"][e.te] = [e.model, e.role]
        elif isinstance(e, TeLeft):
            s["tes"].pop(e.te, None)
        s["version"] += 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RegisterTe):
            ctx.record(TeJoined(te=msg.te, model=msg.model, role=msg.role))
            self._push(ctx, msg.model, msg.role)
        elif isinstance(msg, RemoveTe) and msg.te in self.state["tes"]:
            model, role = self.state["tes"][msg.te]
            ctx.record(TeLeft(te=msg.te, reason=msg.reason))
            self._push(ctx, model, role)

    def _push(self, ctx: Context, model: str, role: str) -> None:
        tes = tuple(sorted(te for te, (m, r) in self.state["tes"].items() if m == model and r == role))
        for je in self.jes:
            ctx.send(je, TeGroupMembership(model=model, role=role, tes=tes,  # type: ignore[arg-type]
                                           version=self.state["version"]))
