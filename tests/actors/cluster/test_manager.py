"""The cluster manager against a scripted pod launcher: the directory published on every change,
failed boots retried with a bounded backoff for as long as the group wants the TE, a boot that never registers timed out, and the stand-in
behaviour (no pods: TEs register themselves) kept for `deepserve sim`."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.cluster.manager import ClusterManager
from deepserve.actors.cluster.messages import (
    DirectoryUpdate,
    RemoveTe,
    TeBootFailed,
    TeBootStep,
    TeFailed,
)
from deepserve.actors.flowserve.messages import RegisterTe
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.pod import LaunchPod, PodExited, PodLaunched, StopPod, TeSlot
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

G = "m/colocated"


class ScriptedPods(Actor[dict]):
    """Answers LaunchPod at once; the TE then boots ("ok"), fails its boot ("fail"), or stays
    silent ("silent"); `fail_first` boots fail before the script applies, and every boot before
    `fail_until_s` (a link down until then)."""

    def __init__(self, script: str = "ok", fail_first: int = 0, fail_until_s: float = 0.0) -> None:
        self.script, self.fail_first, self.fail_until_s, self.launches = script, fail_first, fail_until_s, 0
        self.launched_at: dict[str, list[float]] = {}  # TE -> when each generation was launched

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, LaunchPod):
            self.launches += 1
            self.launched_at.setdefault(msg.te, []).append(ctx.now())
            ctx.send(msg.reply_to, PodLaunched(pod_id=msg.pod_id, te=msg.te, generation=msg.generation,
                                               endpoint=f"ipc:///run/{msg.te.replace('/', '-')}", duration_s=0.5))  # fmt: skip
            fail = self.launches <= self.fail_first or self.script == "fail" or ctx.now() < self.fail_until_s
            if fail:
                ctx.send(msg.manager, TeBootFailed(te=msg.te, generation=msg.generation, pod_id=msg.pod_id,
                                                   reason="HostLoadFailed: ssd read error"))  # fmt: skip
            elif self.script == "crash":  # the pod's process dies during TE-Load, once a TE
                if msg.generation == 1:
                    ctx.send(msg.manager, PodExited(pod_id=msg.pod_id, te=msg.te, generation=msg.generation,
                                                    reason="the TE process was killed by SIGKILL"))  # fmt: skip
                else:
                    self._register(ctx, msg)
            elif self.script == "ok":
                ctx.send(msg.manager, TeBootStep(te=msg.te, generation=msg.generation, pod_id=msg.pod_id,
                                                 step="dram_to_npu", duration_s=0.9, detail="dram-hit"))  # fmt: skip
                ctx.send(msg.manager, RegisterTe(te=msg.te, model="m", role="colocated", dp_groups=1, npus=()))
        elif isinstance(msg, StopPod):
            pass


    def _register(self, ctx: Context, msg: LaunchPod) -> None:
        ctx.send(msg.manager, RegisterTe(te=msg.te, model="m", role="colocated", dp_groups=1, npus=()))


def slots(n: int) -> list[dict[str, Any]]:
    return [msgspec.to_builtins(TeSlot(te=f"te/{i}", group=G, model="m", role="colocated", server=0, host="hw/s0/host",
                                       npus=(f"hw/s0/npu{i}",), tp=1, dp_groups=1, te_config={})) for i in range(n)]  # fmt: skip


def run(script: str, fail_first: int = 0, extra: tuple[tuple[float, Message], ...] = (), fail_until_s: float = 0.0,
        **cfg: Any) -> tuple[SimDriver, list[Any]]:  # fmt: skip
    d = SimDriver(1, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append((env.dst, env.msg))
    d.spawn("pods", ScriptedPods, script=script, fail_first=fail_first, fail_until_s=fail_until_s)
    config = {"jes": ["ext/je"], "pods": "pods", "slots": slots(2), "groups": {G: 2}, "initial_source": "cold",
              "directory_subscribers": ["ext/dir"], **cfg}  # fmt: skip
    d.spawn("cluster", ClusterManager, config=config)
    for at, m in extra:
        d.inject("cluster", m, at=at)
    d.run(until=100.0)
    return d, out


def test_directory_is_published_on_every_change_and_membership_pushed() -> None:
    d, out = run("ok", extra=((5.0, TeFailed(te="te/1", generation=1, reason="operator says so")),))
    dirs = [m for dst, m in out if dst == "ext/dir"]
    assert isinstance(dirs[0], DirectoryUpdate) and dirs[0].routes == {"te/0": "ipc:///run/te-0", "te/0/": "ipc:///run/te-0"}
    assert dirs[-1].routes == {"te/0": "ipc:///run/te-0", "te/0/": "ipc:///run/te-0", "te/1": "ipc:///run/te-1",
                               "te/1/": "ipc:///run/te-1"}  # fmt: skip
    assert ("te/1", "te/1/") in [m.removed for m in dirs]  # the failed generation's entries went first
    assert [m.version for m in dirs] == list(range(1, len(dirs) + 1))
    pushes = [m.tes for dst, m in out if isinstance(m, TeGroupMembership)]
    assert pushes == [("te/0",), ("te/0", "te/1"), ("te/0",), ("te/0", "te/1")]
    r = d.actor("cluster").state.tes["te/1"]
    assert (r.generation, r.state, r.steps["pod_start"], r.details["dram_to_npu"]) == (2, "ready", 0.5, "dram-hit")
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_failed_boot_is_retried_at_once_then_backs_off_doubling_to_the_cap() -> None:
    d, _ = run("ok", fail_first=2)  # te/0 gen 1 and te/1 gen 1 fail, their gen 2 boot (at once)
    st = d.actor("cluster").state
    assert {te: (r.generation, r.state) for te, r in st.tes.items()} == {"te/0": (2, "ready"), "te/1": (2, "ready")}
    assert d.actor("pods").launched_at == {"te/0": [0.0, 0.0], "te/1": [0.0, 0.0]}
    d, _ = run("fail")  # a slot that can never boot: retried for good, at a bounded cadence
    st = d.actor("cluster").state
    # waits 0, 1, 2, 4, 8, 16, then the 30 s cap (boot_backoff_s=1, boot_backoff_max_s=30)
    assert d.actor("pods").launched_at["te/0"] == [0.0, 0.0, 1.0, 3.0, 7.0, 15.0, 31.0, 61.0, 91.0]
    r = st.tes["te/0"]
    assert (r.generation, r.state, r.boot_failures, r.retry_at_s) == (9, "failed", 9, 121.0)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_slot_whose_boots_fail_while_its_link_is_down_boots_once_it_is_back() -> None:
    # before: three failed boots in 3 s (at 0, 0, 0) and the TE was left stopped for good
    d, _ = run("ok", fail_until_s=10.0)
    st = d.actor("cluster").state
    assert d.actor("pods").launched_at["te/0"] == [0.0, 0.0, 1.0, 3.0, 7.0, 15.0]
    r = st.tes["te/0"]
    assert (r.generation, r.state, r.boot_failures, r.since_s) == (6, "ready", 0, 15.0)
    assert [h["state"] for h in r.history] == ["failed"] * 5


def test_a_te_removed_while_it_waits_out_a_backoff_is_stopped_and_not_relaunched() -> None:
    d, _ = run("fail", extra=((5.0, RemoveTe(te="te/0")),))
    st = d.actor("cluster").state
    assert d.actor("pods").launched_at["te/0"] == [0.0, 0.0, 1.0, 3.0]  # the wait 3 -> 7 s was cut short
    assert (st.tes["te/0"].state, st.groups[G].target, st.tes["te/0"].retry_at_s) == ("stopped", 1, None)
    assert len(d.actor("pods").launched_at["te/1"]) == 9  # the other slot goes on


def test_a_boot_that_never_registers_times_out() -> None:
    d, _ = run("silent", boot_timeout_s=10.0)
    st = d.actor("cluster").state
    # timed out at 10, 20, 31, 43, 57, 75 s; relaunched after 0, 1, 2, 4, 8, 16 s
    assert d.actor("pods").launched_at["te/0"] == [0.0, 10.0, 21.0, 33.0, 47.0, 65.0, 91.0]
    assert (st.tes["te/0"].state, st.tes["te/0"].generation) == ("replacing", 7)
    assert st.tes["te/0"].history[-1]["reason"] == "not registered within 10s"


def test_a_pod_that_dies_during_boot_or_after_registering_is_failed_and_replaced_at_once() -> None:
    d, _ = run("crash", boot_timeout_s=50.0)
    st = d.actor("cluster").state
    assert {te: (r.generation, r.state) for te, r in st.tes.items()} == {"te/0": (2, "ready"), "te/1": (2, "ready")}
    (failed,) = [h for h in st.tes["te/0"].history if h.get("generation") == 1]
    assert failed["reason"] == "boot failed: the TE process was killed by SIGKILL during boot"
    assert st.tes["te/0"].launched_s < 1.0  # replaced at once, not at the 50 s boot timeout
    late = PodExited(pod_id="te/0#g2", te="te/0", generation=2, reason="the TE process was killed by SIGKILL")
    d2, out = run("crash", boot_timeout_s=50.0, extra=((5.0, late),))  # te/0 registered at gen 2
    r = d2.actor("cluster").state.tes["te/0"]
    assert (r.generation, r.state) == (3, "ready")  # failed when its process was reaped, not heartbeats later
    (gen2,) = [h for h in r.history if h.get("generation") == 2]
    assert gen2["reason"] == "its pod exited: the TE process was killed by SIGKILL"
    assert r.launched_s == 5.0  # its replacement launched the moment the exit was reported
    pushes = [m.tes for dst, m in out if isinstance(m, TeGroupMembership)]
    assert ("te/1",) in pushes  # the JEs were told at once: they stop routing to it
    stale = PodExited(pod_id="te/0#g1", te="te/0", generation=1, reason="late news")
    d3, _ = run("crash", boot_timeout_s=50.0, extra=((5.0, stale),))  # an older generation's: ignored
    assert d3.actor("cluster").state.tes["te/0"].generation == 2
    assert verify(MemoryLog(d2.sink)).identical  # type: ignore[arg-type]


def test_without_pods_it_is_the_stand_in() -> None:
    d = SimDriver(1, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    d.spawn("cm", ClusterManager, jes=["ext/je"])
    for te in ("te/0", "te/1"):
        d.inject("cm", RegisterTe(te=te, model="m", role="colocated", dp_groups=1, npus=()), at=0.0)
    d.inject("cm", RemoveTe(te="te/0"), at=1.0)
    d.run()  # ends: no timers without pods or heartbeats
    assert [m.tes for m in out] == [("te/0",), ("te/0", "te/1"), ("te/1",)]
    assert d.actor("cm").state.tes["te/0"].state == "stopped"
