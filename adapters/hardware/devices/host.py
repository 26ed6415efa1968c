"""The host actor: a server's DRAM page cache of model files (LRU), its SSD, and weight loading.

Loads move bytes through the fabric (so the SSD, the shared host side and each NPU's host link
are shared max-min fairly with everything else crossing them), then pay tensor initialisation
(loading.py, DeepServe §6.2). This mirrors loading.local_load / loading.npu_fork, which compute
the same thing for a fixed set of concurrent loads.

Shared reads (`shared_reads`, on for every host `spawn_topology` starts): a page cache reads a
file once however many processes read it at the same time. A miss while the same file is already
being read from SSD (by another miss or a pre-load) joins that read instead of starting its own:
its DRAM -> NPU copies start at once and the load waits for the read too, so it ends when both its
copies and the read have ended (the copy streams behind the read; its last chunk's copy is not
charged). A joiner of a read that fails fails with it. Off, every miss reads the file itself: how
hosts behaved before, kept for logs whose Started records lack the argument.

Every load ends. Transfers are asks with the load's timeout: one the fabric's full mailbox drops,
or that gets no answer in time, fails the load (its other transfers are cancelled).
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
from deepserve.adapters.hardware.batch import Parallel, decode_batch, validate
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
from deepserve.adapters.hardware.devices.topology import FABRIC, SSD, host_addr, ssd_addr
from deepserve.adapters.hardware.loading import TENSOR_INIT_S
from deepserve.adapters.hardware.memory import weights_per_npu_bytes
from deepserve.adapters.hardware.models import ModelProfile, model_profile
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s
from deepserve.core import Actor, AskFailed, Context, Event, Message

# A load that takes this many times its bytes pushed one after another through the server's
# slowest path (SSD, host side, scale-out link), plus a minute, has failed: far beyond any
# sharing the fabric does, short of forever. Assumption (a limit on everything), not a figure.
LOAD_TIMEOUT_FACTOR = 4.0
LOAD_TIMEOUT_MIN_S = 60.0
SSD_PATH = "ssd"  # a miss that reads the file from SSD itself
JOINED_PATH = "ssd-shared"  # a miss that joined another load's in-flight SSD read
READ = "#read"  # a joiner's wait for the read it joined, a pseudo transfer in `Job.waiting`


class HostInitDone(Message, frozen=True):
    key: str


class Host(Actor[HostState]):
    def __init__(
        self, server: int = 0, server_kind: str = "gen1-910b", fabric: str = FABRIC,
        dram_bytes: int | None = None, load_timeout_s: float | None = None,
        shared_reads: bool = False,
    ) -> None:  # fmt: skip
        self.server = server
        self.shared_reads = shared_reads
        self.spec = server_spec(server_kind)
        self.fabric = fabric
        self.dram_bytes = self.spec.dram_bytes if dram_bytes is None else dram_bytes
        self.addr = host_addr(server)
        if load_timeout_s is not None and not load_timeout_s > 0:
            raise ValueError(f"load_timeout_s: must be > 0, got {load_timeout_s}")
        self.load_timeout_s = load_timeout_s
        spec = self.spec
        self.slowest_bw = min(
            spec.ssd_read_bw_bytes_per_s, spec.host_aggregate_bw_bytes_per_s,
            effective_bw_bytes_per_s(link_spec(npu_spec(spec.npu).scale_out_link)),
        )  # fmt: skip

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
            self._part_failed(ctx, msg.req_id, msg.reason)
        elif isinstance(msg, AskFailed):
            self._ask_failed(ctx, msg)
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
        m = model_profile(msg.model)
        nbytes = weight_bytes(m)
        key = f"{ctx.sender}|{msg.req_id}"
        if key in self.state.jobs:
            raise ValueError(f"req_id: {msg.req_id!r} is already loading")
        if isinstance(msg, HostPreload):
            self._preload(ctx, msg, key, nbytes)
            return
        targets = msg.targets
        if len(set(targets)) != len(targets):
            raise ValueError("targets: an NPU appears twice")
        if isinstance(msg, HostFork):
            tp = len(msg.sources)
            if tp < 1 or not targets or len(targets) % tp:
                raise ValueError(f"targets: need k x {tp} target NPUs, got {len(targets)}")
            per_npu = self._shard(m, msg, tp)
            parts: list[LinkBroadcast] | list[LinkTransfer] = [
                LinkBroadcast(
                    req_id=f"{key}#{r}", src=msg.sources[r], targets=targets[r::tp],
                    nbytes=per_npu, via=msg.via,
                )
                for r in range(tp)
            ]  # fmt: skip
            self._begin(ctx, msg, key, FORK, per_npu, parts, None)
            return
        if not targets:
            raise ValueError("targets: need at least one target NPU")
        if len(targets) > self.spec.npus:
            raise ValueError(
                f"targets: server has {self.spec.npus} NPUs, got {len(targets)} targets"
            )
        per_npu = self._shard(m, msg, len(targets))
        hit = self.state.cached(msg.model) is not None
        if not hit and self._reading(msg.model, nbytes):
            parts = [
                LinkTransfer(req_id=f"{key}#{i}", src=self.addr, dst=t, nbytes=per_npu)
                for i, t in enumerate(targets)
            ]  # fmt: skip
            self._begin(ctx, msg, key, JOINED_PATH, per_npu, parts, False, joined=True)
            return
        if hit:
            ctx.record(HostCacheTouched(msg.model))
        src = self.addr if hit else ssd_addr(self.server)
        parts = [
            LinkTransfer(req_id=f"{key}#{i}", src=src, dst=t, nbytes=per_npu)
            for i, t in enumerate(targets)
        ]  # fmt: skip
        self._begin(ctx, msg, key, "dram-hit" if hit else SSD_PATH, per_npu, parts, hit)

    @staticmethod
    def _shard(m: ModelProfile, msg: HostLoad | HostFork, ranks: int) -> int:
        """Bytes each die receives: an even split over `ranks` TP ranks, or the layout's shard
        (attention slice + this die's routed experts), as `hw predict` prices it."""
        if msg.tp is None:
            return weight_bytes(m) // ranks
        par = Parallel(
            tp=msg.tp, dp=msg.dp, ep=msg.ep, shared_expert_ranks=msg.shared_expert_ranks,
            redundant_experts=msg.redundant_experts,
        )  # fmt: skip
        validate(m, decode_batch(1, 1), par)
        if ranks > par.tp * par.dp:
            raise ValueError(
                f"targets: the layout has {par.tp * par.dp} dies (tp x dp), got {ranks}"
            )
        return int(weights_per_npu_bytes(m, par))

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
        if self._reading(msg.model, nbytes):
            self._begin(ctx, msg, key, PRELOAD, nbytes, [], None, joined=True)
            return
        part = LinkTransfer(
            req_id=f"{key}#0", src=ssd_addr(self.server), dst=self.addr, nbytes=nbytes
        )
        self._begin(ctx, msg, key, PRELOAD, nbytes, [part], None)

    def _begin(
        self, ctx: Context, msg: HostLoad | HostFork | HostPreload, key: str, path: str,
        per_npu: int, parts: list[LinkTransfer] | list[LinkBroadcast], hit: bool | None,
        joined: bool = False,
    ) -> None:  # fmt: skip
        targets = () if isinstance(msg, HostPreload) else msg.targets
        moved = per_npu * max(1, len(targets))
        timeout = self.load_timeout_s or (
            LOAD_TIMEOUT_MIN_S + LOAD_TIMEOUT_FACTOR * (moved / self.slowest_bw + TENSOR_INIT_S)
        )
        asks = tuple((ctx.ask(self.fabric, p, timeout), p.req_id) for p in parts)
        job = Job(
            key=key, req_id=msg.req_id, model=msg.model, to=reply_to(ctx), path=path,
            targets=targets, bytes_per_npu=per_npu, accepted_at_s=ctx.now(),
            waiting=(*(p.req_id for p in parts), *((key + READ,) if joined else ())), asks=asks,
        )  # fmt: skip
        ctx.record(HostJobStarted(job, hit))

    def _reading(self, model: str, nbytes: int) -> bool:
        """Whether a read of `model` from SSD into the page cache is in flight that a new miss
        can join: shared reads on, and the file fits the cache (a bigger one is read through)."""
        if not self.shared_reads or nbytes > self.dram_bytes:
            return False
        return any(_reads_itself(j) and j.model == model for j in self.state.jobs.values())

    def _joiners(self, model: str) -> list[Job]:
        return [
            j for j in self.state.jobs.values() if j.model == model and j.key + READ in j.waiting
        ]

    # ---- progress ----------------------------------------------------------
    def _part_done(self, ctx: Context, part: str, link_kind: str) -> None:
        key = part.rpartition("#")[0]
        job = self.state.jobs.get(key)
        if job is None or part not in job.waiting:
            return  # the job already failed
        ctx.record(HostPartDone(key, part, link_kind))
        if self.state.jobs[key].waiting:
            return
        read_itself = _reads_itself(job)
        if job.path == SSD_PATH:  # the whole file went through the page cache
            self._fill(ctx, job.model)
        if job.path == PRELOAD:
            evicted = self._fill(ctx, job.model) if read_itself else ()
            self._end(ctx, job, evicted)
        else:
            ctx.record(HostJobInit(key))
            ctx.after(TENSOR_INIT_S, HostInitDone(key), key=f"init:{key}")
        if read_itself:  # the loads that joined this read have their file now
            for j in self._joiners(job.model):
                self._part_done(ctx, j.key + READ, SSD)

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

    def _part_failed(self, ctx: Context, part: str, reason: str) -> None:
        key = part.rpartition("#")[0]
        job = self.state.jobs.get(key)
        if job is None or part not in job.waiting:
            return
        read_itself = _reads_itself(job)
        ctx.record(HostJobEnded(key, False))
        for other in job.waiting:  # the rest of this load would only hold bandwidth now
            if other != part and not other.endswith(READ):
                ctx.send(self.fabric, LinkCancel(req_id=other))
        reason = f"transfer {part.rpartition('#')[2]} failed: {reason}"
        answer(ctx, job.to, HostLoadFailed(req_id=job.req_id, model=job.model, reason=reason))
        if read_itself:  # a read error reaches every reader of the file
            for j in self._joiners(job.model):
                self._part_failed(
                    ctx, j.key + READ, f"the SSD read it joined ({job.req_id}): {reason}"
                )

    def _ask_failed(self, ctx: Context, msg: AskFailed) -> None:
        """A transfer the fabric dropped (mailbox full, fabric gone) or never answered in time:
        the load fails now instead of waiting forever; a late answer finds no job."""
        for job in self.state.jobs.values():  # loads in flight on one host: a handful
            part = next((p for rid, p in job.asks if rid == msg.request_id), None)
            if part is None:
                continue
            if part in job.waiting:
                if msg.reason.startswith("timeout"):  # it may still be in flight: free it
                    ctx.send(self.fabric, LinkCancel(req_id=part))
                self._part_failed(ctx, part, f"no answer from {msg.target}: {msg.reason}")
            return


def _reads_itself(job: Job) -> bool:
    """A miss or a pre-load reading the file from SSD itself (not a joiner), not yet done."""
    return (
        job.path in (SSD_PATH, PRELOAD) and bool(job.waiting) and job.key + READ not in job.waiting
    )
