"""The NPU-fork coordinator forks from where a source TE runs now: a TE the recovery ladder moved
to another server (its boot asked for its weights from there) is the source at its new NPUs and
host, not at its configured slot's."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.fork import NpuForker
from deepserve.actors.cluster.messages import ForkGather, ForkRequest
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.host import HostFork
from deepserve.actors.ports.pod import TeSlot
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
