"""The NPU-fork coordinator forks from where a source TE runs now: a TE the recovery ladder moved
to another server is the source at its new NPUs and host, not at its configured slot's — whether
its boot asked for its weights from there (NPU-fork) or booted from DRAM or cold and only the
manager's membership push says where it is."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.fork import NpuForker
from deepserve.actors.cluster.manager import ClusterManager
from deepserve.actors.cluster.messages import ForkGather, ForkRequest, ScaleGroup, TeFailed
from deepserve.actors.flowserve.messages import RegisterTe
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.host import HostFork
from deepserve.actors.ports.pod import LaunchPod, TeSlot
from deepserve.core import Actor, Context, Event, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.persistence.memory import MemorySink
from deepserve.replay import verify


class Relay(Actor[None]):
    """A host stand-in: passes what it is asked on to the outside."""

    def initial_state(self) -> None:
        return None

    def evolve(self, s: None, e: Event) -> None:
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        ctx.send("ext/seen", msg)


def slot(te: str, server: int, first: int) -> TeSlot:
    return TeSlot(te=te, group="m/colocated", model="m", role="colocated", server=server,
                  host=f"hw/s{server}/host", npus=(f"hw/s{server}/npu{first}",), tp=1, dp_groups=1,
                  te_config={})  # fmt: skip


def fork(moved_to: tuple[str, ...] | None) -> list[HostFork]:
    d = SimDriver(3, sink=MemorySink())
    seen: list[Any] = []
    d.on_external = lambda _t, env: seen.append(env.msg)
    slots = (slot("te/0", 0, 0), slot("te/1", 0, 1))
    d.spawn("cluster/fork", NpuForker, config={"slots": slots, "gather_s": 0.05})
    for server in (0, 1):
        d.spawn(f"hw/s{server}/host", Relay)
    if moved_to is not None:  # te/0's replacement booted on another server and asked from there
        d.inject("cluster/fork", ForkRequest(te="te/0", generation=1, model="m", tp=1, server=1, npus=moved_to,
                                             reply_to="ext/boot0"), at=0.1)  # fmt: skip
        d.inject("cluster/fork", ForkGather(), at=0.2)
    d.inject("cluster/fork", TeGroupMembership(model="m", role="colocated", tes=["te/0"]), at=1.0)
    d.inject("cluster/fork", ForkRequest(te="te/1", generation=1, model="m", tp=1, server=0, npus=slots[1].npus,
                                         reply_to="ext/boot1"), at=2.0)  # fmt: skip
    d.run(until=5.0)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    return [m for m in seen if isinstance(m, HostFork) and m.targets == slots[1].npus]


def test_a_relocated_source_is_forked_from_its_new_npus() -> None:
    (moved,) = fork(("hw/s1/npu4",))
    assert moved.sources == ("hw/s1/npu4",) and moved.via == "roce"  # s1 -> s0: beyond the scale-up domain
    (stayed,) = fork(None)
    assert stayed.sources == ("hw/s0/npu0",) and stayed.via == "hccs"


@pytest.mark.parametrize("source", ["cold", "dram"])
def test_a_source_relocated_without_a_fork_boot_is_forked_from_its_new_npus(source: str) -> None:
    """The manager (ladder rung `substitute`, spare server 1) moves te/0 off its failed server 0;
    its new generation boots from `source` (no ForkRequest: the pod launcher is the outside here,
    the boot's RegisterTe is injected as it would send it); then a scale-out's te/1 on server 2
    forks from it — from server 1's NPU, where it runs, not server 0's, where it failed."""
    d = SimDriver(3, sink=MemorySink())
    seen: list[Any] = []
    d.on_external = lambda _t, env: seen.append(env.msg)
    slots = (slot("te/0", 0, 0), slot("te/1", 2, 0))
    d.spawn("cluster/fork", NpuForker, config={"slots": slots, "gather_s": 0.05})
    d.spawn("cluster", ClusterManager, config={
        "jes": ["cluster/fork"], "pods": "ext/pods", "slots": slots, "groups": {"m/colocated": 1},
        "replace_source": source, "recovery": {"rung": "substitute"}, "spare_servers": [1]})  # fmt: skip
    for server in (0, 1, 2):
        d.spawn(f"hw/s{server}/host", Relay)
    d.inject("cluster", RegisterTe(te="te/0", model="m", role="colocated", dp_groups=1, npus=slots[0].npus), at=0.5)
    d.inject("cluster", TeFailed(te="te/0", generation=1, reason="npu0 lost", diagnosis="device-lost"), at=1.0)
    moved = ("hw/s1/npu0",)  # the spare server's: where generation 2 boots and registers
    d.inject("cluster", RegisterTe(te="te/0", model="m", role="colocated", dp_groups=1, npus=moved), at=2.0)
    d.inject("cluster", ScaleGroup(group="m/colocated", size=2), at=3.0)
    d.inject("cluster/fork", ForkRequest(te="te/1", generation=1, model="m", tp=1, server=2, npus=slots[1].npus,
                                         reply_to="ext/boot1"), at=3.5)  # fmt: skip
    d.run(until=6.0)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    launches = [(m.te, m.generation, m.source, m.slot.npus) for m in seen if isinstance(m, LaunchPod)]
    assert launches == [("te/0", 1, "resident", slots[0].npus), ("te/0", 2, source, moved),
                        ("te/1", 1, source, slots[1].npus)]  # fmt: skip
    assert not [m for m in seen if isinstance(m, ForkRequest)]  # nobody asked the forker from `moved`
    (fork,) = [m for m in seen if isinstance(m, HostFork)]
    assert fork.targets == slots[1].npus
    assert fork.sources == moved and fork.via == "roce"  # s1 -> s2; before: hw/s0/npu0, the failed node's
    assert d.actor("cluster/fork").state.placed == {"te/0": moved}
