"""The daemon's cluster, in-process on `AsyncDriver` (wall clock), and the frontend's view of it.

Actors: the config's whole cluster as `deepserve sim` builds it (deepserve/cluster/assembly.py:
the emulated hardware, the control plane — cluster manager `cluster`, heartbeat monitor
`cluster/heartbeat`, in-process pod launcher `pods`, which starts the initial TEs and every
replacement —, `scheduling.jes` JEs and the gateway at `daemon.ingress`). The frontend never
touches an actor: it injects the gateway's `ApiRequest` and `CancelJob` into the JEs (external
inputs, logged with `src="ext/http"`), and reads what actors send outside — each forward pass's
`TokenBatch`, sent by the DP master straight to `ext/stream` (xDeepServe §4.2's output
short-circuit: no relay through the JE, one message and one log record a pass), the one
`RequestDone` per request and the gateway's 429 `Refused` (both to `ext/metrics`) —
demultiplexed here by request id into one bounded queue per open request. Admin
actions (faults, scaling) are external inputs too (`src="ext/admin"`). `status()` reads actor
state without changing it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from pathlib import Path
from typing import Any

import msgspec
import structlog

from deepserve.actors.cluster.heartbeat import HeartbeatWake
from deepserve.actors.cluster.messages import StopMonitor
from deepserve.actors.cluster.pods import InProcessPods
from deepserve.actors.flowserve.master.status import dp_load
from deepserve.actors.flowserve.messages import Prompt, Sampling, TokenBatch
from deepserve.actors.gateway.messages import ApiRequest, Refused, is_refused
from deepserve.actors.je.messages import CancelJob
from deepserve.actors.je.migration import StreamPosition, StreamPositionAsk
from deepserve.actors.workload.messages import METRICS_ADDR, EndOfRun, RequestDone
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.cluster.assembly import (
    MANAGER_ADDR,
    MONITOR_ADDR,
    PODS_ADDR,
    je_addrs,
    spawn_control,
    spawn_front,
)
from deepserve.cluster.autoscale import status as autoscale_status
from deepserve.cluster.layout import plan
from deepserve.cluster.sim import refused_done
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.messages import Message
from deepserve.persistence import open_sink

from .config import DaemonConfig
from .stream import Stream

log = structlog.get_logger("deepserve.daemon")
LOG_FILE = "daemon.db"
STREAM_QUEUE = 65_536  # tokens + the terminal message a slow client may have pending
STREAM_ADDR = "ext/stream"  # where the DP masters stream output tokens (the frontend)
# The log writer thread waits this long after a wake-up before it commits: steps arrive one at a
# time, and a commit per step (and a thread wake-up per step, GIL handoffs) was ~30 % of the
# daemon's CPU under load (py-spy). A kill -9 may lose this much more of the log's tail.
LOG_LINGER_S = 0.02
# Under load, at most a commit every LOG_FLUSH_S: each commit stores its steps as one zstd page, and
# a quarter second's steps compress ~2x better than a commit's ~20 ms (issue 30: the log per served
# request). A kill -9 may lose up to this much of the log's tail (`async`: replay verifies what is there).
LOG_FLUSH_S = 0.25
# The log writer's SQLite page cache: an append-only log needs its indexes' hot pages only; the
# 64 MiB default filled with the log's pages as it grew, most of the RSS growth users saw. 8 MiB
# still took ~5,000 requests of `bench http` to fill (its pages of ~2 KB a request): RSS rose to
# a plateau ~8 MB higher than with 2 MiB (measured, issue 30 §1), at no CPU cost seen.
LOG_CACHE_KIB = 2048


class NoCapacity(Exception):
    """The cluster cannot take the request (HTTP 503): shutting down, or no TE."""


def keep_no_outside(d: AsyncDriver) -> None:
    """The frontend takes what actors send outside through `on_external`: the driver's own
    copy (`external_out`, 100,000 envelopes for tests and tools) would hold every token chunk
    and terminal message of the last few thousand requests — most of the daemon's RSS growth."""
    d.external_out = deque(maxlen=0)


def te_index(te: str) -> int:
    """`te/12` -> 12: TEs listed in their numeric order."""
    return int(te.rpartition("/")[2])


class Runtime:
    def __init__(self, cfg: DaemonConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.log_path = run_dir / LOG_FILE
        self.layout = plan(cfg)
        self.placement, self.slots, self.groups = self.layout.placement, self.layout.slots, self.layout.groups
        self.jes = je_addrs(cfg)
        self.streams: dict[str, Stream] = {}
        self.accepting = False
        self.started_wall = time.time()
        self.counts = {"accepted": 0, "completed": 0, "failed": 0, "cancelled": 0, "rejected_429": 0}
        self._seq = 0
        self._woken_seq = -1  # the monitor's tick seq of the last HeartbeatWake sent
        self.driver: AsyncDriver | None = None
        self._sink: Any = None
        self.on_done: Any = None  # metrics hook: (RequestDone) -> None
        self.on_tokens: Any = None  # metrics hook: (TaskTokens) -> None
        # request -> the index of its next token the frontend takes (generation.py keeps it; a JE
        # moving the request to another TE asks for it: `StreamPositionAsk`)
        self.positions: dict[str, int] = {}
        self.on_batch: Any = None  # metrics hook: (TokenBatch) -> None, a forward pass's output
        # metrics hook: (TokenBatch) -> None, on_batch and on_tokens for each chunk in one call
        self.on_pass: Any = None
        self.on_rejected: Any = None  # metrics hook: (request id) -> None, a request refused with 429
        self.on_timer_late: Any = None  # metrics hook: (timer key, seconds late), the driver's timers
        self._log: Any = None  # `log` bound (`_bound_log`)

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.cfg.faults:  # a scenario's plan is virtual time's: the daemon takes `deepserve fault`
            log.warning("the config's [[faults]] are not injected by deepserve up (use deepserve fault)",
                        faults=len(self.cfg.faults))  # fmt: skip
        self._sink = open_sink(str(self.log_path), "async", linger_s=LOG_LINGER_S, flush_s=LOG_FLUSH_S,
                               cache_kib=LOG_CACHE_KIB)
        config = msgspec.to_builtins(self.cfg)
        d = AsyncDriver(seed=self.cfg.daemon.seed, sink=self._sink, config=config,
                        mailbox_capacity=65_536)  # fmt: skip
        await d.__aenter__()
        self.driver = d
        keep_no_outside(d)
        d.on_external = self._on_external
        d.timer_late = self.on_timer_late
        c = self.cfg.cluster
        spawn_topology(d, build(c.topology, self.placement.servers + self.cfg.recovery.spare_servers),
                       variance=c.npu_variance)  # the recovery ladder's spare pool too
        self.spawn_front(d)
        self.spawn_control(d)
        self.accepting = True

    def spawn_front(self, d: AsyncDriver) -> None:
        """The JEs and the gateway (at `daemon.ingress`, the one address the frontend talks to)."""
        spawn_front(d, self.cfg, gateway=self.cfg.daemon.ingress, stream_to=STREAM_ADDR,
                    max_inflight=self.cfg.daemon.max_inflight)  # fmt: skip

    def spawn_control(self, d: AsyncDriver) -> None:
        """The control plane with the in-process pod launcher (processes mode overrides this to
        put its supervisor's launcher at `pods`)."""
        spawn_control(d, self.cfg, self.layout, self.jes)

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace_s`, fail the rest with a
        reason (recorded), stop the heartbeats, stop the pods (`_stop_pods`), flush the log."""
        d = self.driver
        if d is None:
            return
        self.accepting = False
        await self._drain(d, grace_s)
        if self.cfg.control.heartbeats:
            await d.inject(MONITOR_ADDR, StopMonitor(reason="the daemon shut down"), src="ext/operator")
        await self._stop_pods()
        try:
            await d.__aexit__(None, None, None)
        except TypeError as exc:  # a final snapshot the kernel cannot encode: still flush the log
            log.error("final snapshots failed; the log is closed without them", error=str(exc))
        finally:
            self.driver = None
            self._sink.close()
            self._closed()

    async def _drain(self, d: AsyncDriver, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.streams:
            await d.inject(self.cfg.daemon.ingress, EndOfRun(reason="the daemon shut down"), src="ext/operator")
            end = time.monotonic() + 2.0
            while self.streams and time.monotonic() < end:
                await asyncio.sleep(0.01)

    async def _stop_pods(self) -> None:
        """In-process pods stop with the driver; processes mode stops and reaps its processes."""

    def _closed(self) -> None:
        """After the log is closed (processes mode removes its socket directory)."""

    # ---- requests ------------------------------------------------------------------------
    def new_request_id(self, kind: str) -> str:
        self._seq += 1
        return f"{kind}-{self._seq}"

    async def submit(self, request_id: str, prompt: Prompt, sampling: Sampling,
                     stream: bool = True, model: str = "") -> Stream:  # fmt: skip
        if not self.accepting or self.driver is None:
            raise NoCapacity("the daemon is shutting down")
        # Admission is the gateway's (`max_inflight_per_model` = daemon.max_inflight): a refusal
        # is recorded there (`GatewayRefused`) and comes back as the request's one terminal state.
        q = Stream(STREAM_QUEUE)  # asyncio.Queue's semantics, cheaper (stream.py)
        self.streams[request_id] = q
        self.counts["accepted"] += 1
        msg = ApiRequest(request_id=request_id, model=model or self.cfg.cluster.model, prompt=prompt, sampling=sampling,
                         reply_to=METRICS_ADDR, stream=stream)  # fmt: skip
        await self.driver.inject(self.cfg.daemon.ingress, msg, corr=request_id, src="ext/http")
        await self._wake_heartbeats()
        return q

    async def _wake_heartbeats(self) -> None:
        """Traffic while the heartbeat monitor is backed off (idle): tell it, once a tick, so
        the next heartbeat is one base interval away (actors/cluster/heartbeat.py)."""
        cell = self.driver.cells.get(MONITOR_ADDR) if self.driver is not None else None
        st = cell.actor.state if cell is not None and cell.actor is not None else None
        if st is None or st.interval_s <= self.cfg.control.heartbeat_interval_s or st.seq == self._woken_seq:
            return
        self._woken_seq = st.seq
        await self.driver.inject(MONITOR_ADDR, HeartbeatWake(), src="ext/http")  # type: ignore[union-attr]

    async def cancel(self, request_id: str, reason: str, completed: bool = False) -> None:
        """To every JE (the gateway drew one; the others ignore it): the JE cancels the task on
        its TE, whose master frees the KV blocks, and the request ends as cancelled (completed,
        with `completed`: a stop sequence ended it)."""
        if self.driver is not None and request_id in self.streams:
            cancel = CancelJob(request_id=request_id, reason=reason, completed=completed)
            for je in self.jes:
                await self.driver.inject(je, cancel, corr=request_id, src="ext/http")

    def _on_external(self, _t: float, env: Any) -> None:
        msg = env.msg
        if type(msg) is TokenBatch:  # a pass's chunks, straight from a DP master
            streams, on_tokens = self.streams, self.on_tokens
            if self.on_pass is not None:  # the pass's metrics in one call (Metrics.pass_output)
                self.on_pass(msg)
                on_tokens = None
            elif self.on_batch is not None:
                self.on_batch(msg)
            for chunk in msg.chunks:
                if on_tokens is not None:
                    on_tokens(chunk)
                q = streams.get(chunk.request_id)
                if q is not None:
                    q.offer(chunk)  # a client too slow for STREAM_QUEUE chunks misses some
        elif type(msg) is StreamPositionAsk:  # a JE moving a stream: how far did the client get?
            if self.driver is not None:
                at = StreamPosition(request_id=msg.request_id, next_index=self.positions.get(msg.request_id, 0))
                self.driver.inject_nowait(msg.reply_to, at, corr=msg.request_id, src="ext/stream")
        elif isinstance(msg, RequestDone | Refused):
            self.positions.pop(msg.request_id, None)
            q = self.streams.pop(msg.request_id, None)
            if type(msg) is Refused:  # over daemon.max_inflight: HTTP 429
                msg = refused_done(msg, self.now())
            if is_refused(msg.status, msg.reason):
                self.counts["rejected_429"] += 1
                self.counts["accepted"] -= 1
                if self.on_rejected is not None:
                    self.on_rejected(msg.request_id)
            else:
                self.counts[msg.status] = self.counts.get(msg.status, 0) + 1
                # One line a request that did not complete; a completed one at debug, as vLLM logs
                # no line a request by default (a JSON line a request was ~6 % of the CPU under load).
                lg = self._log or self._bound_log()
                (lg.debug if msg.status == "completed" else lg.info)(
                    "request finished", request_id=msg.request_id, actor=msg.te, status=msg.status,
                    reason=msg.reason, output_tokens=msg.output_tokens)  # fmt: skip
                if self.on_done is not None:
                    self.on_done(msg)
            if q is not None:
                if q.full():
                    q.get_nowait()  # the terminal message must arrive: drop a token instead
                q.put_nowait(msg)

    def _bound_log(self) -> Any:
        """The module's logger bound once, at the first finished request: through structlog's
        lazy proxy each call built a logger from the configuration (its factory, its wrapper),
        ~0.3 % of the daemon's CPU under load (py-spy), for a debug line that mostly prints
        nothing. The configuration of that moment stays (as structlog's cache_logger_on_first_use)."""
        self._log = log.bind()
        return self._log

    def now(self) -> float:
        return self.driver.clock() if self.driver is not None else 0.0

    # ---- admin ---------------------------------------------------------------------------
    async def admin_input(self, dst: str, msg: Message) -> None:
        if self.driver is None:
            raise NoCapacity("the daemon is not running")
        await self.driver.inject(dst, msg, src="ext/admin")

    def link_names(self) -> list[str]:
        """The emulated fabric's links ("s0/npu3/roce", ...): what link faults can name."""
        return [link.name for link in build(self.cfg.cluster.topology, self.placement.servers).links]

    def cluster_state(self) -> Any:
        """The cluster manager's state (TEs with generation and state, groups), or None."""
        cell = self.driver.cells.get(MANAGER_ADDR) if self.driver is not None else None
        return cell.actor.state if cell is not None and cell.actor is not None else None

    def status(self) -> dict[str, Any]:
        """TEs with generation and state, roles, DP groups, loads and KV usage (masters' state)."""
        d = self.driver
        cm = self.cluster_state()
        slots = {s.te: s for s in self.slots}
        rows = []
        for te in sorted(cm.tes if cm is not None else {}, key=te_index):
            r, slot = cm.tes[te], slots[te]
            dps = []
            for i in range(slot.dp_groups if r.state not in ("stopped", "failed") else 0):
                addr = f"{te}/dp/{i}"
                cell = d.cells.get(addr) if d is not None else None
                # A replacement's master is alive from its spawn, but has no actor (nor
                # state) until its `Started` is delivered: under load that can take a while.
                if cell is None or not cell.alive or cell.actor is None:
                    dps.append({"master": addr, "alive": False})
                    continue
                master: Any = cell.actor  # a DP-group master: its state and config
                ld = dp_load(master.state, master.cfg)
                dps.append({"master": addr, "alive": True, **msgspec.to_builtins(ld)})
            g = cm.groups.get(r.group)  # a flipped TE's group (and role) is not its slot's
            rows.append({"te": te, "role": g.role if g is not None else slot.role, "group": r.group, "server": slot.server,
                         "npus": list(slot.npus), "generation": r.generation, "state": r.state,
                         "reason": r.reason or _last_failure(r), "boot_steps": dict(r.steps), "failures": r.failures, "dps": dps})  # fmt: skip
        groups = {g: {"target": rec.target, "ready": sum(1 for x in rows if x["group"] == g and x["state"] == "ready"),
                      "slots": sum(1 for s in self.slots if s.group == g)}
                  for g, rec in (cm.groups.items() if cm is not None else ())}  # fmt: skip
        return {"model": self.cfg.model_name(), "uptime_s": round(time.time() - self.started_wall, 1),
                "inflight": len(self.streams), "requests": dict(self.counts), "log": str(self.log_path),
                "groups": groups, "tes": rows, **autoscale_status(d, cm), **prewarm_status(d)}  # fmt: skip


def prewarm_status(d: Any) -> dict[str, Any]:
    """`prewarm`: the pod launcher's pre-warmed pods, masters and executors per server (DeepServe
    §6.1), when `[scaling]` is on and the launcher is the in-process one (it keeps the pools)."""
    cell = d.cells.get(PODS_ADDR) if d is not None else None
    pods = cell.actor if cell is not None and cell.alive else None
    if not isinstance(pods, InProcessPods):
        return {}
    p = pods.pools_status()
    if not p.enabled:
        return {}
    return {"prewarm": {"policy": p.policy, "pods": p.pods, "masters": p.masters,
                        "executors": {f"s{k}": v for k, v in sorted(p.executors.items(), key=lambda kv: int(kv[0]))}}}


def _last_failure(r: Any) -> str:
    """Why the previous generation ended ("" for a first generation)."""
    if not r.history:
        return ""
    past = r.history[-1]
    return f"gen {past['generation']} {past['state']}: {past['reason']}"
