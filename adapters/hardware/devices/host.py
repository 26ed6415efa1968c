"""The host actor: a server's DRAM page cache of model files (LRU), its SSD, and weight loading.

Loads move bytes through the fabric (so the SSD, the shared host side and each NPU's host link
are shared max-min fairly with everything else crossing them), then pay tensor initialisation
(loading.py, DeepServe §6.2). This mirrors loading.local_load / loading.npu_fork, which compute
the same thing for a fixed set of concurrent loads.
"""

from __future__ import annotations

from deepserve.actors.ports.host import (
    HostEvict,
    HostEvicted,
    HostFork,
    HostLoad,
    HostLoadDone,
    HostLoadFailed,
    HostPreload,
    HostPreloaded,
    HostProbe,
    HostStatus,
)
from deepserve.actors.ports.link import (
    LinkBroadcast,
    LinkBroadcastDone,
    LinkCancel,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.adapters.hardware.devices.common import answer, reply_to, respond
from deepserve.adapters.hardware.devices.host_state import (
    FORK,
    PRELOAD,
    HostCacheEvicted,
    HostCacheFilled,
    HostCacheTouched,
    HostJobEnded,
    HostJobInit,
    HostJobStarted,
    HostPartDone,
    HostState,
    Job,
    evolve_host,
)
from deepserve.adapters.hardware.devices.topology import FABRIC, host_addr, ssd_addr
from deepserve.adapters.hardware.loading import TENSOR_INIT_S
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import server_spec
from deepserve.core import Actor, Context, Event, Message


class HostInitDone(Message, frozen=True):
    key: str


class Host(Actor[HostState]):
    def __init__(
        self, server: int = 0, server_kind: str = "gen1-910b", fabric: str = FABRIC,
        dram_bytes: int | None = None,
    ) -> None:  # fmt: skip
        self.server = server
        self.spec = server_spec(server_kind)
        self.fabric = fabric
        self.dram_bytes = self.spec.dram_bytes if dram_bytes is None else dram_bytes
        self.addr = host_addr(server)

    def initial_state(self) -> HostState:
        return HostState()

    def evolve(self, state: HostState, event: Event) -> HostState:
        return evolve_host(state, event)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, HostLoad | HostFork | HostPreload):
            try:
                self._start(ctx, msg)
            except ValueError as exc:  # includes unknown model names
                respond(ctx, HostLoadFailed(req_id=msg.req_id, model=msg.model, reason=str(exc)))
        elif isinstance(msg, LinkTransferDone | LinkBroadcastDone):
            self._part_done(ctx, msg.req_id, msg.link_kind)
        elif isinstance(msg, LinkTransferFailed):
            self._part_failed(ctx, msg)
        elif isinstance(msg, HostInitDone):
            self._finish(ctx, msg.key)
        elif isinstance(msg, HostEvict):
            cached = self.state.cached(msg.model)
            if cached is not None:
                ctx.record(HostCacheEvicted(msg.model))
            respond(
                ctx,
                HostEvicted(
                    req_id=msg.req_id, model=msg.model, nbytes=cached.nbytes if cached else 0
                ),
            )
        elif isinstance(msg, HostProbe):
            st = self.state
            respond(ctx,
                HostStatus(
                    req_id=msg.req_id, host=ctx.self, cached=tuple(c.model for c in st.cache),
                    dram_bytes_used=st.dram_bytes_used(), dram_bytes=self.dram_bytes,
                    loads_in_flight=len(st.jobs),
                )
            )  # fmt: skip

    # ---- starting ----------------------------------------------------------
    def _start(self, ctx: Context, msg: HostLoad | HostFork | HostPreload) -> None:
        nbytes = weight_bytes(model_profile(msg.model))
        key = f"{ctx.sender}|{msg.req_id}"
        if key in self.state.jobs:
            raise ValueError(f"req_id: {msg.req_id!r} is already loading")
        if isinstance(msg, HostPreload):
            self._preload(ctx, msg, key, nbytes)
            return
        targets = msg.targets
        tp = len(msg.sources) if isinstance(msg, HostFork) else len(targets)
        if tp < 1 or not targets or len(targets) % tp:
            raise ValueError(f"targets: need k x {tp} target NPUs, got {len(targets)}")
        if len(set(targets)) != len(targets):
            raise ValueError("targets: an NPU appears twice")
        per_npu = nbytes // tp
        if isinstance(msg, HostFork):
            parts = [
                LinkBroadcast(
                    req_id=f"{key}#{r}", src=msg.sources[r], targets=targets[r::tp],
                    nbytes=per_npu, via=msg.via,
                )
                for r in range(tp)
            ]  # fmt: skip
            self._begin(ctx, msg, key, FORK, per_npu, parts, None)
            return
        if tp > self.spec.npus:
            raise ValueError(f"targets: server has {self.spec.npus} NPUs, got {tp} targets")
        hit = self.state.cached(msg.model) is not None
        if hit:
            ctx.record(HostCacheTouched(msg.model))
        src = self.addr if hit else ssd_addr(self.server)
        parts = [
            LinkTransfer(req_id=f"{key}#{i}", src=src, dst=t, nbytes=per_npu)
            for i, t in enumerate(targets)
        ]  # fmt: skip
        self._begin(ctx, msg, key, "dram-hit" if hit else "ssd", per_npu, parts, hit)

    def _preload(self, ctx: Context, msg: HostPreload, key: str, nbytes: int) -> None:
        if self.state.cached(msg.model) is not None:
            ctx.record(HostCacheTouched(msg.model))
            respond(
                ctx,
                HostPreloaded(
                    req_id=msg.req_id, model=msg.model, hit=True, duration_s=0.0, evicted=()
                ),
            )
            return
        if nbytes > self.dram_bytes:
            raise ValueError(
                f"model: {msg.model} ({nbytes} bytes) exceeds DRAM ({self.dram_bytes} bytes)"
            )
        part = LinkTransfer(
            req_id=f"{key}#0", src=ssd_addr(self.server), dst=self.addr, nbytes=nbytes
        )
        self._begin(ctx, msg, key, PRELOAD, nbytes, [part], None)

    def _begin(
        self, ctx: Context, msg: HostLoad | HostFork | HostPreload, key: str, path: str,
        per_npu: int, parts: list[LinkTransfer] | list[LinkBroadcast], hit: bool | None,
    ) -> None:  # fmt: skip
        targets = () if isinstance(msg, HostPreload) else msg.targets
        job = Job(
            key=key, req_id=msg.req_id, model=msg.model, to=reply_to(ctx), path=path,
            targets=targets, bytes_per_npu=per_npu, accepted_at_s=ctx.now(),
            waiting=tuple(p.req_id for p in parts),
        )  # fmt: skip
        ctx.record(HostJobStarted(job, hit))
        for part in parts:
            ctx.send(self.fabric, part)

    # ---- progress ----------------------------------------------------------
    def _part_done(self, ctx: Context, part: str, link_kind: str) -> None:
        key = part.rpartition("#")[0]
        job = self.state.jobs.get(key)
        if job is None or part not in job.waiting:
            return  # the job already failed
        ctx.record(HostPartDone(key, part, link_kind))
        if self.state.jobs[key].waiting:
            return
        if job.path == "ssd":  # the whole file went through the page cache
            self._fill(ctx, job.model)
        if job.path == PRELOAD:
            evicted = self._fill(ctx, job.model)
            self._end(ctx, job, evicted)
            return
        ctx.record(HostJobInit(key))
        ctx.after(TENSOR_INIT_S, HostInitDone(key), key=f"init:{key}")

    def _fill(self, ctx: Context, model: str) -> tuple[str, ...]:
        """Put a file read from SSD into the cache, evicting least recently used files."""
        st = self.state
        if st.cached(model) is not None:
            ctx.record(HostCacheTouched(model))
            return ()
        nbytes = weight_bytes(model_profile(model))
        if nbytes > self.dram_bytes:
            return ()  # too big to cache: read through
        free, evicted = self.dram_bytes - st.dram_bytes_used(), []
        for c in st.cache:
            if free >= nbytes:
                break
            evicted.append(c.model)
            free += c.nbytes
        ctx.record(HostCacheFilled(model, nbytes, tuple(evicted)))
        assert self.state.dram_bytes_used() <= self.dram_bytes, "page cache over capacity"
        return tuple(evicted)

    def _finish(self, ctx: Context, key: str) -> None:
        job = self.state.jobs.get(key)
        if job is not None and job.initialising:
            self._end(ctx, job, ())

    def _end(self, ctx: Context, job: Job, evicted: tuple[str, ...]) -> None:
        ctx.record(HostJobEnded(job.key, True))
        duration = ctx.now() - job.accepted_at_s
        if job.path == PRELOAD:
            done: Message = HostPreloaded(
                req_id=job.req_id, model=job.model, hit=False, duration_s=duration, evicted=evicted
            )
        else:
            done = HostLoadDone(
                req_id=job.req_id, model=job.model, path=job.path, duration_s=duration,
                bytes_per_npu=job.bytes_per_npu, targets=job.targets,
            )  # fmt: skip
        answer(ctx, job.to, done)

    def _part_failed(self, ctx: Context, msg: LinkTransferFailed) -> None:
        key = msg.req_id.rpartition("#")[0]
        job = self.state.jobs.get(key)
        if job is None:
            return
        ctx.record(HostJobEnded(key, False))
        for part in job.waiting:  # the rest of this load would only hold bandwidth now
            if part != msg.req_id:
                ctx.send(self.fabric, LinkCancel(req_id=part))
        reason = f"transfer {msg.req_id.rpartition('#')[2]} failed: {msg.reason}"
        answer(ctx, job.to, HostLoadFailed(req_id=job.req_id, model=job.model, reason=reason))
