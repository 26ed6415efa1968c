"""The processes-mode runtime (`deepserve up --processes`): the single-process `Runtime`'s
frontend contract (submit, cancel, streams, admin inputs, status) over a cluster whose TEs
each run in their own OS process.

The main process holds the control plane (cluster manager, heartbeat monitor, the launcher
at `pods`), the hardware shared across TEs (the fabric — every link, so max-min sharing and
PD KV transfers are computed in one place — and each server's host: DRAM page cache, SSD,
weight loads), the JE and the gateway, on one `AsyncDriver` with a ZeroMQ transport and its
own log (`daemon.db`). Each TE process holds the TE's NPUs, its bootstrap, shell, heartbeat
fan-out and DP masters, and writes `te-<n>-g<generation>.db` beside it. See docs/decisions.md.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import structlog

from deepserve.adapters.hardware.devices.fabric import Fabric
from deepserve.adapters.hardware.devices.host import Host
from deepserve.adapters.hardware.devices.topology import FABRIC, build, host_addr
from deepserve.adapters.zmq import Limits, ZmqTransport
from deepserve.cluster.autoscale import pushed_to, spawn_autoscaler
from deepserve.cluster.control import FORK_ADDR, MONITOR_ADDR, PODS_ADDR, spawn_control_plane
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.messages import Message
from deepserve.persistence import open_sink

from ..runtime import (
    LOG_CACHE_KIB,
    LOG_FLUSH_S,
    LOG_LINGER_S,
    STREAM_ADDR,
    Runtime,
    keep_no_outside,
)
from .launcher import ProcessPods
from .messages import PeerRoutes, SignalProcess, SpawnProcess, WarmProcesses
from .routes import apply_peer_routes, main_prefixes
from .supervisor import Supervisor, log_name
from .warm import ScalingProcessPods, ScalingProcPodsState

log = structlog.get_logger("deepserve.daemon")
CLOSE_TIMEOUT_S = 2.0  # how long a closing transport waits for its peers' last acks
STATUS_FRESH_S = 5.0  # a TE process's load file older than this is not shown


class ProcRuntime(Runtime):
    mode = "processes"

    def __init__(self, cfg: Any, run_dir: Path) -> None:
        super().__init__(cfg, run_dir)
        self.transport: ZmqTransport | None = None
        self.supervisor: Supervisor | None = None
        self.sock_dir: Path | None = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # ipc:// paths hold at most 107 bytes: the sockets live in a short temporary directory.
        self.sock_dir = Path(tempfile.mkdtemp(prefix="ds-"))
        self._sink = open_sink(str(self.log_path), "async", linger_s=LOG_LINGER_S, flush_s=LOG_FLUSH_S,
                               cache_kib=LOG_CACHE_KIB)
        self.transport = ZmqTransport(bind=f"ipc://{self.sock_dir}/main", limits=Limits(close_timeout_s=CLOSE_TIMEOUT_S))
        d = AsyncDriver(seed=self.cfg.daemon.seed, sink=self._sink, config=msgspec.to_builtins(self.cfg),
                        mailbox_capacity=65_536, transport=self.transport)  # fmt: skip
        await d.__aenter__()
        self.driver = d
        keep_no_outside(d)
        d.on_external = self._on_external_procs
        d.timer_late = self.on_timer_late  # (the NPUs' timers fire in the TE processes)
        c = self.cfg.cluster
        topo = build(c.topology, self.placement.servers + self.cfg.recovery.spare_servers)  # + the ladder's spares
        # The hardware shared across TEs stays here; each TE's NPUs live in its process.
        d.spawn(FABRIC, Fabric, cluster=topo.cluster, servers=topo.servers)
        for s in range(topo.servers):
            d.spawn(host_addr(s), Host, server=s, server_kind=topo.server_kind, shared_reads=True)
        self.spawn_front(d)
        base = {"run_id": d.run_id, "seed": d.seed, "epoch": d.epoch, "main_endpoint": self.transport.endpoint,
                "main_prefixes": main_prefixes([*d.cells, PODS_ADDR, MONITOR_ADDR, "cluster"]),
                "npu_kind": topo.npu_kind, "variance": c.npu_variance, "parent_pid": os.getpid(),
                "log_format": self.cfg.daemon.log_format, "close_timeout_s": CLOSE_TIMEOUT_S,
                "stream_to": STREAM_ADDR}  # fmt: skip
        self.supervisor = Supervisor(run_dir=self.run_dir, sock_dir=self.sock_dir, directory=self.transport.directory,
                                     inject=self._to_launcher, base=base)  # fmt: skip
        self.spawn_control(d)
        self.accepting = True

    def spawn_control(self, d: AsyncDriver) -> None:
        """The launcher first (the manager's first `LaunchPod`s go to it at once), subscribed to
        the manager's directory; no in-process pods."""
        spares = tuple(range(self.placement.servers, self.placement.servers + self.cfg.recovery.spare_servers))
        pods: dict[str, Any] = {"te_preload_s": self.cfg.control.te_preload_s}
        sc = self.cfg.scaling
        if sc.enabled:  # the pools, with real pre-warmed processes (warm.py); off: as before
            pods.update(pod_start_s=self.cfg.control.pod_start_s, scaling=msgspec.to_builtins(sc),
                        servers=sorted({s.server for s in self.slots} | set(spares)),
                        forker=FORK_ADDR if sc.fork else "")  # fmt: skip
            d.spawn(PODS_ADDR, ScalingProcessPods, config=pods)
        else:
            d.spawn(PODS_ADDR, ProcessPods, config=pods)
        spawn_control_plane(d, self.slots, self.groups, pushed_to(self.cfg, self.jes), self.cfg.control,
                            directory_subscribers=(PODS_ADDR,), pods_addr=PODS_ADDR, in_process_pods=False,
                            recovery=self.cfg.recovery, spare_servers=spares,
                            scaling=sc if sc.enabled else None, topology=self.cfg.cluster.topology)  # fmt: skip
        if self.cfg.autoscale.enabled:
            spawn_autoscaler(d, self.cfg, self.slots, self.groups)

    async def _stop_pods(self) -> None:
        """Every TE process is stopped (its log flushed) and reaped, its exit recorded, before
        the main driver's final snapshots, transport and log close."""
        if self.supervisor is not None:
            await self.supervisor.shutdown()

    def _closed(self) -> None:
        if self.sock_dir is not None:
            shutil.rmtree(self.sock_dir, ignore_errors=True)

    # ---- the launcher's outside world ------------------------------------------------------
    def _on_external_procs(self, t: float, env: Any) -> None:
        msg = env.msg
        if isinstance(msg, SpawnProcess | SignalProcess | WarmProcesses):
            if self.supervisor is not None:
                self.supervisor.submit(msg)
        elif isinstance(msg, PeerRoutes):
            if self.transport is not None:
                problem = apply_peer_routes(self.transport.directory, msg, self.transport.endpoint or "")
                if problem:
                    log.error("directory entry refused", error=problem)
        else:
            self._on_external(t, env)

    async def _to_launcher(self, msg: Message) -> None:
        if self.driver is not None:
            await self.driver.inject(PODS_ADDR, msg, src="ext/supervisor")

    # ---- status --------------------------------------------------------------------------
    def pods_state(self) -> Any:
        cell = self.driver.cells.get(PODS_ADDR) if self.driver is not None else None
        return cell.actor.state if cell is not None and cell.actor is not None else None

    def status(self) -> dict[str, Any]:
        """The single-process status, with each TE's process (pod, pid, phase, log) and its DP
        masters' loads as the process last wrote them."""
        st = super().status()
        pods = self.pods_state()
        live = sorted(pods.pods.items(), key=lambda kv: kv[1].launch.generation) if pods is not None else []
        by_te = {p.launch.te: (pid, p) for pid, p in live}  # the newest pod of each TE
        for row in st["tes"]:
            pid_p = by_te.get(row["te"])
            if pid_p is None:
                row.update(pod="", pid=None, process="exited")
                row["dps"] = [{**dp, "alive": False} for dp in row["dps"]]
                continue
            pod_id, p = pid_p
            row.update(pod=pod_id, pid=p.pid or None, process=p.phase, process_log=p.log)
            row["dps"] = self._remote_loads(pod_id, row)
        st["mode"] = "processes"
        if isinstance(pods, ScalingProcPodsState):  # DeepServe §6.1's pools; masters are real processes
            p = pods.pools
            st["prewarm"] = {"policy": self.cfg.scaling.pool_policy, "pods": p.pods, "masters": p.masters,
                             "executors": {f"s{k}": v for k, v in sorted(p.executors.items(), key=lambda kv: int(kv[0]))},
                             "warm_processes": [{"pid": w.pid, "python_s": round(w.python_s, 3)} for w in pods.warm]}  # fmt: skip
        st["logs"] = sorted(str(f) for f in self.run_dir.glob("*.db"))
        st["processes"] = [{"pod": pid, "te": p.launch.te, "generation": p.launch.generation, "pid": p.pid or None,
                            "phase": p.phase, "log": p.log} for pid, p in live]  # fmt: skip
        return st

    def _remote_loads(self, pod_id: str, row: dict[str, Any]) -> list[dict[str, Any]]:
        """The DP loads the TE process last wrote; its NPU timer lateness into `row` (counts that
        only grow: kept whatever their age, for /metrics)."""
        dps: list[dict[str, Any]] = row["dps"]
        if self.sock_dir is None:
            return dps
        path = self.sock_dir / f"{log_name(pod_id)}.json"
        try:
            body = json.loads(path.read_text())
        except (OSError, ValueError):
            return [{**dp, "alive": False} for dp in dps]
        if isinstance(body.get("npu_timer_lateness"), dict):
            row["npu_timer_lateness"] = body["npu_timer_lateness"]
        if self.now() - float(body.get("at_s", -1e9)) > STATUS_FRESH_S:
            return [{**dp, "alive": False} for dp in dps]
        return list(body.get("dps", dps))

