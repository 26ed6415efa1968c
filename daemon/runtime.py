"""The daemon's cluster, in-process on `AsyncDriver` (wall clock), and the frontend's view of it.

The frontend never touches an actor: it injects `Arrive` / `CancelRequest` into the ingress
address (external inputs, logged with `src="ext/http"`) and reads what actors send outside —
`TaskTokens` relayed by the ingress and the one `RequestDone` per request — demultiplexed here
by request id into one bounded queue per open request. Admin actions (faults) are external
inputs too (`src="ext/admin"`). `status()` reads actor state without changing it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgspec
import structlog

from deepserve.actors.flowserve.master.status import dp_load
from deepserve.actors.flowserve.messages import Prompt, Sampling, TaskTokens
from deepserve.actors.ingress import CancelRequest, Ingress
from deepserve.actors.workload.messages import Arrive, EndOfRun, RequestDone
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.adapters.scenario.builder import spawn_te
from deepserve.adapters.scenario.placement import Placement, place
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.messages import Message
from deepserve.persistence import open_sink

from .config import DaemonConfig

log = structlog.get_logger("deepserve.daemon")
LOG_FILE = "daemon.db"
STREAM_QUEUE = 65_536  # tokens + the terminal message a slow client may have pending


class Overloaded(Exception):
    """More requests in flight than `daemon.max_inflight` (HTTP 429)."""


class NoCapacity(Exception):
    """The cluster cannot take the request (HTTP 503): shutting down, or no TE."""


def daemon_placement(cfg: DaemonConfig) -> tuple[Placement, set[str]]:
    """The colocated pool's placement, then the P/D pool's on the servers after it (its TEs
    numbered on), and the addresses of the P/D TEs."""
    colo = place(cfg.cluster)
    pd = cfg.pd_scenario()
    if pd is None:
        return colo, set()
    extra = place(pd.cluster)
    n, base = len(colo.tes), colo.servers
    moved = []
    for i, te in enumerate(extra.tes):
        npus = tuple(a.replace(f"hw/s{te.server}/", f"hw/s{te.server + base}/", 1) for a in te.npus)
        moved.append(msgspec.structs.replace(te, addr=f"te/{n + i}", server=te.server + base, npus=npus))
    return Placement(base + extra.servers, (*colo.tes, *moved)), {t.addr for t in moved}


class Runtime:
    def __init__(self, cfg: DaemonConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.log_path = run_dir / LOG_FILE
        self.placement, self.pd_tes = daemon_placement(cfg)
        self.streams: dict[str, asyncio.Queue[Any]] = {}
        self.accepting = False
        self.started_wall = time.time()
        self.counts = {"accepted": 0, "completed": 0, "failed": 0, "cancelled": 0, "rejected_429": 0}
        self._seq = 0
        self.driver: AsyncDriver | None = None
        self._sink: Any = None
        self.on_done: Any = None  # metrics hook: (RequestDone) -> None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._sink = open_sink(str(self.log_path), "async")
        config = msgspec.to_builtins(self.cfg)
        d = AsyncDriver(seed=self.cfg.daemon.seed, sink=self._sink, config=config,
                        mailbox_capacity=65_536)  # fmt: skip
        await d.__aenter__()
        self.driver = d
        d.on_external = self._on_external
        c = self.cfg.cluster
        spawn_topology(d, build(c.topology, self.placement.servers), variance=c.npu_variance)
        scenario, pd = self.cfg.scenario(), self.cfg.pd_scenario()
        for te in self.placement.tes:
            spawn_te(d, pd if te.addr in self.pd_tes and pd is not None else scenario, te)
        p = self.placement
        d.spawn(self.cfg.daemon.ingress, Ingress, mode="colocated", tes=p.role("colocated"),
                prefill_tes=p.role("prefill"), decode_tes=p.role("decode"))  # fmt: skip
        self.accepting = True

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish for `grace_s`, fail the rest with a
        reason (recorded), flush the log."""
        d = self.driver
        if d is None:
            return
        self.accepting = False
        deadline = time.monotonic() + grace_s
        while self.streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.streams:
            await d.inject(self.cfg.daemon.ingress, EndOfRun(reason="the daemon shut down"),
                           src="ext/operator")  # fmt: skip
            end = time.monotonic() + 2.0
            while self.streams and time.monotonic() < end:
                await asyncio.sleep(0.01)
        try:
            await d.__aexit__(None, None, None)
        except TypeError as exc:  # a final snapshot the kernel cannot encode: still flush the log
            log.error("final snapshots failed; the log is closed without them", error=str(exc))
        finally:
            self.driver = None
            self._sink.close()

    # ---- requests ------------------------------------------------------------------------
    def new_request_id(self, kind: str) -> str:
        self._seq += 1
        return f"{kind}-{self._seq}"

    async def submit(self, request_id: str, prompt: Prompt, sampling: Sampling) -> asyncio.Queue[Any]:
        if not self.accepting or self.driver is None:
            raise NoCapacity("the daemon is shutting down")
        if len(self.streams) >= self.cfg.daemon.max_inflight:
            self.counts["rejected_429"] += 1
            raise Overloaded(f"{len(self.streams)} requests in flight (daemon.max_inflight)")
        q: asyncio.Queue[Any] = asyncio.Queue(STREAM_QUEUE)
        self.streams[request_id] = q
        self.counts["accepted"] += 1
        msg = Arrive(request_id=request_id, model=self.cfg.cluster.model, prompt=prompt, sampling=sampling)
        await self.driver.inject(self.cfg.daemon.ingress, msg, corr=request_id, src="ext/http")
        return q

    async def cancel(self, request_id: str, reason: str) -> None:
        if self.driver is not None and request_id in self.streams:
            await self.driver.inject(self.cfg.daemon.ingress, CancelRequest(request_id=request_id, reason=reason),
                                     corr=request_id, src="ext/http")  # fmt: skip

    def _on_external(self, _t: float, env: Any) -> None:
        msg = env.msg
        if isinstance(msg, TaskTokens):
            q = self.streams.get(msg.request_id)
            if q is not None and not q.full():
                q.put_nowait(msg)
        elif isinstance(msg, RequestDone):
            q = self.streams.pop(msg.request_id, None)
            self.counts[msg.status] = self.counts.get(msg.status, 0) + 1
            log.info("request finished", request_id=msg.request_id, actor=msg.te, status=msg.status,
                     reason=msg.reason, output_tokens=msg.output_tokens)  # fmt: skip
            if self.on_done is not None:
                self.on_done(msg)
            if q is not None:
                if q.full():
                    q.get_nowait()  # the terminal message must arrive: drop a token instead
                q.put_nowait(msg)

    def now(self) -> float:
        return self.driver.clock() if self.driver is not None else 0.0

    # ---- admin ---------------------------------------------------------------------------
    async def admin_input(self, dst: str, msg: Message) -> None:
        if self.driver is None:
            raise NoCapacity("the daemon is not running")
        await self.driver.inject(dst, msg, src="ext/admin")

    def status(self) -> dict[str, Any]:
        """TEs, roles, DP groups, loads and KV usage, read from the masters' state."""
        d = self.driver
        rows = []
        for te in self.placement.tes:
            dps = []
            shell = d.cells.get(te.addr) if d is not None else None
            addrs = getattr(shell.actor, "dp_addrs", []) if shell is not None else []
            for addr in addrs:
                cell = d.cells.get(addr) if d is not None else None
                if cell is None or not cell.alive:
                    dps.append({"master": addr, "alive": False})
                    continue
                ld = dp_load(cell.actor.state, cell.actor.cfg)
                dps.append({"master": addr, "alive": True, **msgspec.to_builtins(ld)})
            rows.append({"te": te.addr, "role": te.role, "server": te.server, "npus": list(te.npus), "dps": dps})
        return {"model": self.cfg.model_name(), "uptime_s": round(time.time() - self.started_wall, 1),
                "inflight": len(self.streams), "requests": dict(self.counts), "log": str(self.log_path),
                "tes": rows}  # fmt: skip
