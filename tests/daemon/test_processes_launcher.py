"""The processes-mode pod launcher (`daemon/procs/launcher.py`) under SimDriver, against a
recording manager and pod agent: a launch becomes a `SpawnProcess` for the supervisor; a process
up becomes `PodLaunched` (before the agent is told to boot); a process that exits is recorded and
nothing more — no restart, the heartbeat monitor and the manager decide — unless it never came
up; kills and stops become signals, once; the manager's directory reaches every process. Pure
route helpers beside it. The launcher's log replays identically."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.messages import DirectoryUpdate
from deepserve.actors.ports.pod import (
    BootSpec,
    KillPod,
    LaunchPod,
    PodExited,
    PodFailed,
    PodLaunched,
    PodStopped,
    StopPod,
    TeSlot,
)
from deepserve.adapters.zmq import Directory
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.daemon.procs.launcher import PodAgent, ProcessPods, exit_reason
from deepserve.daemon.procs.messages import (
    HOST_DIRECTORY,
    SUPERVISOR,
    BootPod,
    PeerRoutes,
    ProcessExited,
    ProcessStartFailed,
    ProcessUp,
    SignalProcess,
    SpawnProcess,
)
from deepserve.daemon.procs.routes import (
    apply_peer_routes,
    drop_endpoint,
    main_prefixes,
    pod_routes,
)
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

EP = "ipc:///tmp/ds-x/te-0-g1"


class Recorder(Actor[None]):
    """Keeps what it receives (the manager's and the pod agent's stand-in)."""

    def __init__(self) -> None:
        self.got: list[Message] = []

    def handle(self, ctx: Context, msg: Message) -> None:
        self.got.append(msg)


def slot(te: str = "te/0") -> TeSlot:
    return TeSlot(te=te, group="m/colocated", model="m", role="colocated", server=0, host="hw/s0/host",
                  npus=("hw/s0/npu0",), tp=1, dp_groups=1, te_config={})  # fmt: skip


def launch(gen: int = 1, source: str = "cold", te: str = "te/0") -> LaunchPod:
    return LaunchPod(pod_id=f"{te}#g{gen}", te=te, role="colocated", model="m", generation=gen, slot=slot(te),
                     source=source, manager="cluster", heartbeat_timeout_s=0.5, reply_to="cluster")  # type: ignore[arg-type]


def cluster(*inputs: tuple[float, Message]) -> tuple[SimDriver, list[tuple[float, str, Message]]]:
    d = SimDriver(3, sink=MemorySink())
    out: list[tuple[float, str, Message]] = []
    d.on_external = lambda t, env: out.append((t, env.dst, env.msg))
    d.spawn("pods", ProcessPods, config={"te_preload_s": 0.7})
    d.spawn("cluster", Recorder)
    d.spawn("te/0/pod", Recorder)
    for at, m in inputs:
        src = "ext/supervisor" if type(m).__module__.endswith("procs.messages") else "ext/operator"
        d.inject("pods", m, at=at, src=src)
    d.run(until=100.0)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    return d, out


def got(d: SimDriver, addr: str) -> list[Message]:
    return d.actor(addr).got


def test_a_launch_is_a_process_spawn_and_up_is_pod_launched_before_the_boot() -> None:
    d, out = cluster((0.0, launch()), (0.0, launch(1, "resident", "te/1")),
                     (2.5, ProcessUp(pod_id="te/0#g1", pid=4242, endpoint=EP, log="/run/te-0-g1.db")))  # fmt: skip
    spawns = [m for _, dst, m in out if dst == SUPERVISOR]
    assert [type(m) for m in spawns] == [SpawnProcess, SpawnProcess]
    assert spawns[0].spec.te_preload_s == 0.7 and spawns[0].spec.source == "cold"
    assert spawns[1].spec.te_preload_s == 0.0  # resident weights: no TE-Pre-Load
    assert spawns[0].spec.slot == slot() and spawns[0].spec.heartbeat_timeout_s == 0.5
    (launched,) = got(d, "cluster")
    assert isinstance(launched, PodLaunched) and launched.endpoint == EP and launched.duration_s == pytest.approx(2.5)
    routes, boot = got(d, "te/0/pod")
    assert isinstance(routes, PeerRoutes) and isinstance(boot, BootPod) and boot.spec.pod_id == "te/0#g1"
    pod = d.actor("pods").state.pods["te/0#g1"]
    assert (pod.phase, pod.pid, pod.log) == ("up", 4242, "/run/te-0-g1.db")


def test_an_exit_is_recorded_reported_to_the_manager_and_nothing_restarts_it() -> None:
    d, out = cluster((0.0, launch()), (1.0, ProcessUp(pod_id="te/0#g1", pid=7, endpoint=EP, log="")),
                     (5.0, ProcessExited(pod_id="te/0#g1", pid=7, returncode=-9)))  # fmt: skip
    assert [type(m) for _, dst, m in out if dst == SUPERVISOR] == [SpawnProcess]  # no second spawn
    launched, exited = got(d, "cluster")  # the manager is told; replacing it is its decision
    assert isinstance(launched, PodLaunched) and isinstance(exited, PodExited)
    assert (exited.pod_id, exited.generation, exited.reason) == ("te/0#g1", 1,
                                                                 "the TE process (pid 7) was killed by SIGKILL")
    st = d.actor("pods").state
    assert (st.pods, st.exited, st.failed) == ({}, 1, 0)
    assert exit_reason(-9) == "the TE process was killed by SIGKILL"


def test_an_exit_at_the_daemons_shutdown_is_recorded_and_reported_to_nobody() -> None:
    """The supervisor stopped it on the way out: not a crash the manager should replace."""
    d, _out = cluster((0.0, launch()), (1.0, ProcessUp(pod_id="te/0#g1", pid=7, endpoint=EP, log="")),
                      (5.0, ProcessExited(pod_id="te/0#g1", pid=7, returncode=0, shutdown=True)))  # fmt: skip
    assert [type(m) for m in got(d, "cluster")] == [PodLaunched]
    st = d.actor("pods").state
    assert (st.pods, st.exited, st.failed) == ({}, 1, 0)


@pytest.mark.parametrize("end", [ProcessExited(pod_id="te/0#g1", pid=7, returncode=1),
                                 ProcessStartFailed(pod_id="te/0#g1", reason="no 'ready' within 60s")])
def test_a_pod_that_never_came_up_fails_its_launch(end: Message) -> None:
    d, _ = cluster((0.0, launch()), (3.0, end))
    (failed,) = got(d, "cluster")
    assert isinstance(failed, PodFailed) and failed.pod_id == "te/0#g1" and failed.generation == 1
    assert "status 1" in failed.reason or "no 'ready'" in failed.reason
    assert d.actor("pods").state.failed == 1


def test_kill_and_stop_become_signals_once_and_a_relaunch_stops_the_leftover() -> None:
    up = ProcessUp(pod_id="te/0#g1", pid=7, endpoint=EP, log="")
    d, out = cluster((0.0, launch()), (1.0, up), (2.0, KillPod(te="te/0", reason="kill-te te/0")),
                     (2.5, KillPod(te="te/0")), (3.0, StopPod(pod_id="te/0#g1", te="te/0", reason="stop", reply_to="cluster")))  # fmt: skip
    sig = [m for _, dst, m in out if isinstance(m, SignalProcess)]
    assert [(m.pod_id, m.kill) for m in sig] == [("te/0#g1", True)]  # killed already: no SIGTERM after it
    assert isinstance(got(d, "cluster")[-1], PodStopped)

    d, out = cluster((0.0, launch()), (1.0, up), (4.0, launch(2)))
    sent = [m for _, dst, m in out if dst == SUPERVISOR]
    assert [type(m) for m in sent] == [SpawnProcess, SignalProcess, SpawnProcess]
    assert not sent[1].kill and sent[1].reason == "replaced by te/0#g2"


def test_a_fork_or_dram_source_is_launched() -> None:
    # every source LaunchPod's type admits is implemented now (dram, fork: issue 34); without
    # [scaling] the plain launcher has no fork coordinator: a fork loads through the host (with
    # [scaling], daemon/procs/warm.py and docs/scaling.md)
    for source in ("fork", "dram"):
        d, out = cluster((0.0, launch(source=source)))
        (spawn,) = [m for _, dst, m in out if dst == SUPERVISOR]
        assert isinstance(spawn, SpawnProcess) and spawn.spec.source == source


def test_the_managers_directory_reaches_the_main_process_and_every_pod() -> None:
    table = {"te/0": EP, "te/0/": EP, "te/1": "ipc:///tmp/ds-x/te-1-g1", "te/1/": "ipc:///tmp/ds-x/te-1-g1"}
    d, out = cluster((0.0, launch()), (1.0, ProcessUp(pod_id="te/0#g1", pid=7, endpoint=EP, log="")),
                     (2.0, DirectoryUpdate(version=3, routes=table)),
                     (3.0, DirectoryUpdate(version=2, routes={})))  # stale: ignored  # fmt: skip
    mine = [m for _, dst, m in out if dst == HOST_DIRECTORY]
    assert [(m.version, m.routes) for m in mine] == [(3, table)]
    assert [m.version for m in got(d, "te/0/pod") if isinstance(m, PeerRoutes)] == [0, 3]


def test_the_pod_agent_boots_once_and_hands_routes_to_its_host() -> None:
    d = SimDriver(1, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append((env.dst, env.msg))
    d.spawn("te/0/pod", PodAgent, te="te/0")
    boot = BootPod(spec=BootSpec(pod_id="te/0#g1", generation=1, slot=slot(), source="cold", manager="cluster",
                                 te_preload_s=50.0))  # fmt: skip
    d.inject("te/0/pod", boot)
    d.inject("te/0/pod", boot, at=1.0)
    d.inject("te/0/pod", PeerRoutes(version=1, routes={"te/1": "ipc:///x"}), at=2.0)
    d.run(until=10.0)
    assert d.alive("te/0/boot") and d.actor("te/0/pod").state.booted == "te/0#g1"
    assert [m for dst, m in out if dst == HOST_DIRECTORY] == [PeerRoutes(version=1, routes={"te/1": "ipc:///x"})]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_routes_never_point_a_process_at_itself() -> None:
    d = Directory({"cluster": "ipc:///m", "te/1": "ipc:///b", "te/1/": "ipc:///b"})
    msg = PeerRoutes(version=2, routes={"te/0": "ipc:///a", "te/0/": "ipc:///a", "te/2": "ipc:///c"},
                     removed=("te/1", "te/1/"))  # fmt: skip
    assert apply_peer_routes(d, msg, "ipc:///a", ("te/0", "te/0/")) == ""
    assert d.routes() == {"cluster": "ipc:///m", "te/2": "ipc:///c"}
    assert "scheme" in apply_peer_routes(d, PeerRoutes(version=3, routes={"te/5": "http://x"}), "ipc:///a")
    d.update(pod_routes(slot(), "ipc:///a"))
    assert d.resolve("hw/s0/npu0") == "ipc:///a" and d.resolve("te/0/dp/0") == "ipc:///a"
    assert sorted(drop_endpoint(d, "ipc:///a")) == ["hw/s0/npu0", "te/0", "te/0/"]
    assert main_prefixes(["hw/fabric", "hw/s0/host", "je/0", "gateway", "cluster/heartbeat", "cluster"]) == (
        "cluster", "gateway", "hw", "je")
