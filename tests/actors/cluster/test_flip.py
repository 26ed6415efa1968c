"""The cluster manager's role flip (actors/cluster/flip.py): a ready TE moves between its model's
prefill and decode groups — membership only, no pod launched; the joined group is pushed first;
bad flips refused naming why; a flipped TE that fails is replaced in the group it was flipped to."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.cluster.autoscaler_messages import FlipTe
from deepserve.actors.cluster.manager import ClusterManager
from deepserve.actors.cluster.messages import TeFailed
from deepserve.actors.flowserve.messages import RegisterTe
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.pod import LaunchPod, PodLaunched, TeSlot
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

P, D = "m/prefill", "m/decode"


class Pods(Actor[dict]):
    """Boots every TE at once; remembers each launch (TE, generation, group)."""

    def __init__(self) -> None:
        self.launched: list[tuple[float, str, int, str]] = []

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, LaunchPod):
            self.launched.append((ctx.now(), msg.te, msg.generation, msg.slot.group))
            ctx.send(msg.reply_to, PodLaunched(pod_id=msg.pod_id, te=msg.te, generation=msg.generation, endpoint="",
                                               duration_s=0.5))  # fmt: skip
            ctx.send(msg.manager, RegisterTe(te=msg.te, model="m", role=msg.role, dp_groups=1, npus=()))


def slot(i: int, group: str) -> dict[str, Any]:
    role = group.split("/")[1]
    return msgspec.to_builtins(TeSlot(te=f"te/{i}", group=group, model="m", role=role, server=i, host=f"hw/s{i}/host",
                                      npus=(f"hw/s{i}/npu0",), tp=1, dp_groups=1, te_config={}))  # fmt: skip


def run(*extra: tuple[float, Message]) -> tuple[SimDriver, list[Any]]:
    d = SimDriver(1, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    d.spawn("pods", Pods)
    d.spawn("cluster", ClusterManager, config={
        "jes": ["ext/je"], "pods": "pods", "slots": [slot(0, P), slot(1, P), slot(2, D), slot(3, D)],
        "groups": {P: 2, D: 2}, "initial_source": "cold"})  # fmt: skip
    for at, m in extra:
        d.inject("cluster", m, at=at)
    d.run(until=50.0)
    return d, out


def groups(d: SimDriver) -> dict[str, tuple[int, tuple[str, ...]]]:
    st = d.actor("cluster").state
    return {g: (r.target, tuple(sorted(te for te, t in st.tes.items() if t.group == g and t.state == "ready")))
            for g, r in st.groups.items()}  # fmt: skip


def test_a_flip_moves_membership_only_joined_group_first() -> None:
    d, out = run((5.0, FlipTe(te="te/2", src=D, dst=P, reason="predicted TTFT over SLO")))
    assert groups(d) == {P: (3, ("te/0", "te/1", "te/2")), D: (1, ("te/3",))}
    assert sorted(x[1] for x in d.actor("pods").launched) == ["te/0", "te/1", "te/2", "te/3"]  # at start only
    after = [(m.role, m.tes) for m in out if isinstance(m, TeGroupMembership)][-2:]
    assert after == [("prefill", ("te/0", "te/1", "te/2")), ("decode", ("te/3",))]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_bad_flips_are_refused_naming_why() -> None:
    d, _ = run((5.0, FlipTe(te="te/9", src=D, dst=P, reason="")), (5.0, FlipTe(te="te/2", src=P, dst=D, reason="")),
               (5.0, FlipTe(te="te/2", src=D, dst="x/prefill", reason="")))  # fmt: skip
    reasons = [msgspec.msgpack.decode(e.payload)["reason"] for st in d.sink.steps for e in st.events
               if e.type == "FlipRefused"]  # fmt: skip
    assert reasons == ["te: te/9 is not a ready TE", "src: te/2 is in m/decode, not m/prefill",
                       "dst: no other TE group 'x/prefill'"]  # fmt: skip
    assert groups(d) == {P: (2, ("te/0", "te/1")), D: (2, ("te/2", "te/3"))}


def test_a_flipped_te_that_fails_is_replaced_in_the_group_it_joined() -> None:
    d, _ = run((5.0, FlipTe(te="te/2", src=D, dst=P, reason="")), (10.0, TeFailed(te="te/2", generation=1, reason="x")))
    assert d.actor("pods").launched[-1][:3] == (10.0, "te/2", 2)
    assert groups(d) == {P: (3, ("te/0", "te/1", "te/2")), D: (1, ("te/3",))}
