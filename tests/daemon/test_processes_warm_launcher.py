"""The processes-mode launcher with `[scaling]` (`daemon/procs/warm.py`) under SimDriver, against a
recording manager and pod agent: it asks the supervisor for the pre-warmed processes of its pool;
a scale-out waits Scaler-Pre, then claims the oldest ready process (`SpawnProcess.warm_pid`) and
asks for a new one at once; the process up gives the manager a `python_start` step (the measured
seconds the supervisor reported) and the pod agent the boot plan (`BootPod.scale`: fork
coordinator, warm-up); a pod stopped during its Scaler-Pre gives its process back to the pool; a
process lost before it was ready is not asked again at once (no crash loop). The log replays."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.messages import TeBootStep
from deepserve.actors.ports.pod import LaunchPod, PodFailed, PodLaunched, StopPod, TeSlot
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.daemon.procs.messages import (
    SUPERVISOR,
    BootPod,
    ProcessUp,
    ProcessWarm,
    ProcessWarmLost,
    SpawnProcess,
    WarmProcesses,
)
from deepserve.daemon.procs.warm import ScalingProcessPods
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

EP = "ipc:///tmp/ds-x/te-1-g1"
SCALING = {"enabled": True, "pod_pool": 1, "master_pool": 2, "executor_pool_per_server": 1, "fork": True,
           "pod_attach_s": 0.1, "te_attach_s": 0.2}  # fmt: skip


class Recorder(Actor[None]):
    def __init__(self) -> None:
        self.got: list[Message] = []

    def handle(self, ctx: Context, msg: Message) -> None:
        self.got.append(msg)


def launch(te: str = "te/1") -> LaunchPod:
    s = TeSlot(te=te, group="m/colocated", model="m", role="colocated", server=0, host="hw/s0/host",
               npus=("hw/s0/npu1",), tp=1, dp_groups=1, te_config={})  # fmt: skip
    return LaunchPod(pod_id=f"{te}#g1", te=te, role="colocated", model="m", generation=1, slot=s, source="fork",
                     manager="cluster", heartbeat_timeout_s=0.0, reply_to="cluster")  # fmt: skip


def run(*inputs: tuple[float, Message]) -> tuple[SimDriver, list[tuple[float, str, Message]]]:
    d = SimDriver(5, sink=MemorySink())
    out: list[tuple[float, str, Message]] = []
    d.on_external = lambda t, env: out.append((t, env.dst, env.msg))
    d.spawn("pods", ScalingProcessPods, config={"te_preload_s": 0.3, "pod_start_s": 2.0, "scaling": SCALING,
                                                "servers": [0], "forker": "cluster/fork"})  # fmt: skip
    d.spawn("cluster", Recorder)
    d.spawn("te/1/pod", Recorder)
    for at, m in inputs:
        src = "ext/supervisor" if type(m).__module__.endswith("procs.messages") else "ext/operator"
        d.inject("pods", m, at=at, src=src)
    d.run(until=100.0)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    return d, out


def sent(out: list[tuple[float, str, Message]], kind: type) -> list[tuple[float, Any]]:
    return [(t, m) for t, dst, m in out if dst == SUPERVISOR and isinstance(m, kind)]


def test_a_scale_out_claims_the_oldest_warm_process_after_scaler_pre_and_tops_the_pool_up() -> None:
    d, out = run((1.0, ProcessWarm(pid=101, python_s=1.5)), (1.2, ProcessWarm(pid=102, python_s=1.7)),
                 (5.0, launch()), (6.0, ProcessUp(pod_id="te/1#g1", pid=101, endpoint=EP, log="", start_s=0.25,
                                                  warm_python_s=1.5)))  # fmt: skip
    assert [m.count for _, m in sent(out, WarmProcesses)] == [2, 1]  # the pool at start, then one refill
    ((at, spawn),) = sent(out, SpawnProcess)
    assert at == pytest.approx(5.1) and spawn.warm_pid == 101  # after the pre-warmed pod's 0.1 s
    assert spawn.spec.te_preload_s == pytest.approx(0.2)  # a pre-warmed TE: model bound only
    st = d.actor("pods").state
    assert [w.pid for w in st.warm] == [102] and st.pools.masters == 1 and st.warming == 1
    launched, step = d.actor("cluster").got
    assert isinstance(launched, PodLaunched) and isinstance(step, TeBootStep)
    assert step.step == "python_start" and step.duration_s == 0.25 and "pre-warmed process pid 101" in step.detail
    (boot,) = [m for m in d.actor("te/1/pod").got if isinstance(m, BootPod)]
    assert boot.scale is not None and boot.scale["forker"] == "cluster/fork" and boot.scale["warmup"] is True


def test_without_a_ready_process_the_pod_starts_cold_and_python_is_not_modeled_twice() -> None:
    d, out = run((5.0, launch()), (8.0, ProcessUp(pod_id="te/1#g1", pid=300, endpoint=EP, log="", start_s=0.6)))
    ((at, spawn),) = sent(out, SpawnProcess)
    assert spawn.warm_pid == 0 and at == pytest.approx(5.1)  # the pod pool still had its pod
    assert spawn.spec.te_preload_s == pytest.approx(1.8)  # NPU init 1.8 + HCCL 0: Python is the real step
    step = d.actor("cluster").got[1]
    assert step.step == "python_start" and step.detail == "real: cold process pid 300"


def test_a_pod_stopped_in_scaler_pre_gives_its_process_back_and_a_lost_start_is_not_retried_at_once() -> None:
    d, out = run((1.0, ProcessWarm(pid=101, python_s=1.5)), (2.0, launch()),
                 (2.05, StopPod(pod_id="te/1#g1", te="te/1", reason="scale in", reply_to="cluster")),
                 (3.0, ProcessWarmLost(pid=777, reason="not warm")))  # fmt: skip
    assert sent(out, SpawnProcess) == []  # never asked: it was stopped before Scaler-Pre ended
    st = d.actor("pods").state
    assert [w.pid for w in st.warm] == [101] and st.pods == {}
    assert any(isinstance(m, PodFailed) for m in d.actor("cluster").got)
    # asked 2 at start, 1 more at the claim; the lost one (never ready) is not asked again
    assert [m.count for _, m in sent(out, WarmProcesses)] == [2, 1]
