"""KV migration from a failed TE's host DRAM (xLLM §3.5 with its multi-level KV cache, §3.4):
the DP masters' side of moving a request's surviving KV to another TE.

- Backup (`MasterConfig.kv_backup`): each prompt block a master indexes in HBM is written through
  to its host's DRAM tier as well (xLLM's rule "if data resides in HBM, it must also be present in
  DRAM"), one background RTC copy per batch of newly cached blocks, best effort (no copy while the
  RTC's copies are all in flight). That DRAM copy is what survives a device fault.
- Survey (`KvExportAsk`, source side): a master answers with the leading run of a request's chain
  held in its DRAM tier (`rtc.export.dram_run`) — only while its process lives: a killed process or
  a lost node answers nothing, and the JE recomputes.
- Import (`KvImport`, target side): the target master reserves HBM blocks for the part of the chain
  it does not already cache, and a `KvImporter` child pins the source (asks again: the source may
  have been torn down since the survey) and moves the bytes — one fabric transfer per TP rank from
  the source's host to the target's NPU. On success the blocks are indexed under the chain's
  hashes and released to the prefix cache, so the resumed task's own prefix match finds them and
  prefills only the tail; on failure they are freed and the task recomputes. Either way the JE is
  told (`KvImported`).

The path: host DRAM -> the target NPU is one fabric route on the same server (PCIe) or on a
CloudMatrix (UB). Across gen1 servers, which have no host-side NIC in the model, the bytes leave
through a healthy neighbour NPU's RoCE NIC on the source server (RDMA from registered host memory:
host PCIe -> that NPU's PCIe -> its RoCE -> the target's RoCE), so they contend with that NPU's
traffic and never touch the failed chip.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.rtc.export import dram_run, unsaved
from deepserve.actors.flowserve.rtc.master import match_by_prefix
from deepserve.actors.ports.link import LinkTransfer, LinkTransferDone, LinkTransferFailed
from deepserve.core import Actor, Context, Event, Message
from deepserve.core.messages import Undelivered

if TYPE_CHECKING:
    from deepserve.actors.flowserve.master.actor import DpMaster

IMPORT_SEQ = "kvimport:"  # the RTC sequence that holds the blocks of an import while they arrive
_NPU = re.compile(r"^hw/s(\d+)/npu(\d+)$")
_HOST = re.compile(r"^hw/s(\d+)/host$")


class KvExportAsk(Message, frozen=True, kw_only=True):
    """To a TE shell (which passes it to each DP master) or a DP master: which leading blocks of
    `hashes` does your host's DRAM tier hold? Answered `KvExportOffer` to `reply_to` by a master
    holding at least one (an importer asks a master directly, and always gets an answer)."""

    request_id: str
    hashes: tuple[int, ...]
    reply_to: str
    always: bool = False  # answer even with no block (an importer's pin)
    live: bool = False  # live migration: the source's device works, its HBM copy is read


class KvExportOffer(Message, frozen=True, kw_only=True):
    request_id: str
    master: str  # the DP master holding the blocks
    host: str  # its host endpoint (where the bytes leave from)
    blocks: int  # the leading blocks of the asked chain its DRAM tier holds
    block_bytes: int  # one block's KV on ONE rank
    tp: int
    srcs: tuple[str, ...] = ()  # live: the source NPUs the bytes leave from, one a rank (else `host`)


class KvImport(Message, frozen=True, kw_only=True):
    """JE -> the target TE (its shell passes it to DP group 0) or its only master: bring the first
    `len(hashes)` blocks of a request's chain from `offer`'s host into HBM before its task comes."""

    request_id: str
    task_id: str  # the task that will use them (named in records)
    hashes: tuple[int, ...]
    offer: KvExportOffer
    reply_to: str
    timeout_s: float = 10.0


class KvImported(Message, frozen=True, kw_only=True):
    """Target master -> JE: the import's outcome (`blocks` moved over the fabric; 0 when the
    target already cached them all)."""

    request_id: str
    task_id: str
    ok: bool
    te: str = ""
    blocks: int = 0
    nbytes: int = 0
    duration_s: float = 0.0
    reason: str = ""


class KvImportDone(Message, frozen=True, kw_only=True):
    """Importer -> its master: everything the master needs to finish (it keeps no import state)."""

    seq: str
    request_id: str
    task_id: str
    reply_to: str
    hashes: tuple[int, ...]
    skip: int  # leading blocks the target cached already (not moved)
    ok: bool
    reason: str = ""
    nbytes: int = 0
    duration_s: float = 0.0


def handles(msg: Message) -> bool:
    return isinstance(msg, KvExportAsk | KvImport | KvImportDone)


def handle(m: DpMaster, ctx: Context, msg: Message) -> None:
    if isinstance(msg, KvExportAsk):
        _offer(m, ctx, msg)
    elif isinstance(msg, KvImport):
        _start_import(m, ctx, msg)
    elif isinstance(msg, KvImportDone):
        _end_import(m, ctx, msg)


def backup(m: DpMaster, ctx: Context, cached: rtc.RtcBlocksCached) -> None:
    """Write-through: copy newly indexed blocks to the DRAM tier (skipped while every copy slot
    is taken: a block that is not backed up is recomputed after a fault, never wrong)."""
    st = m.state.rtc
    if len(st.copies) >= st.config.max_copies_in_flight:
        return
    todo = unsaved(st, cached.hashes)
    copy = rtc.copy_to_dram(st, todo) if todo else None
    if copy is not None:
        ctx.record(copy)
        m._move(ctx, copy)  # the master's own DRAM-tier transfer (PCIe d2h), finished like a swap-out


def _offer(m: DpMaster, ctx: Context, msg: KvExportAsk) -> None:
    """A survey's answer. The offered run is pinned in a keeper (`KvKeeper`, the host's KV agent:
    it outlives this TE's teardown, not its node) that the target's importer pulls from. Live
    (the device works), the run is read from HBM, held by the request's own task until the JE
    switches it over."""
    cfg = m.cfg
    live = msg.live and not m.state.device_lost
    if live:
        run = msg.hashes[: len(match_by_prefix(m.state.rtc, msg.hashes).hbm_blocks)]  # the HBM run a live device reads
        if run or msg.always:
            ctx.send(msg.reply_to, KvExportOffer(request_id=msg.request_id, master=ctx.self, host=cfg.host,
                                                 blocks=len(run), block_bytes=cfg.kv_block_bytes, tp=cfg.tp,
                                                 srcs=cfg.npus), corr=msg.request_id)  # fmt: skip
        return
    run = msg.hashes[: len(dram_run(m.state.rtc, msg.hashes))] if cfg.dram_blocks else ()
    if not run and not msg.always:
        return
    src = ctx.self
    if run and not msg.always:
        src = f"{ctx.self}/keep/{ctx.new_id()}"
        keep = KeeperConfig(request_id=msg.request_id, hashes=run, host=cfg.host, block_bytes=cfg.kv_block_bytes,
                            tp=cfg.tp, keep_s=KEEP_S)  # fmt: skip
        ctx.spawn(src, KvKeeper, config=msgspec.to_builtins(keep))
    ctx.send(msg.reply_to, KvExportOffer(request_id=msg.request_id, master=src, host=cfg.host, blocks=len(run),
                                         block_bytes=cfg.kv_block_bytes, tp=cfg.tp), corr=msg.request_id)  # fmt: skip


# ---- the keeper: a surveyed run, pinned on the source's host ------------------------------------

KEEP_S = 60.0  # the lease: a run nobody pulled or released is freed after this long


class KvExportRelease(Message, frozen=True, kw_only=True):
    """To a keeper: its run was pulled, or will not be (the JE recomputes): free it."""

    request_id: str


class KeeperExpired(Message, frozen=True, kw_only=True):
    pass


class KeeperConfig(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    hashes: tuple[int, ...]  # the pinned run, a prefix of the request's chain
    host: str
    block_bytes: int
    tp: int
    keep_s: float


class KvKeeper(Actor[None]):
    """The host's hold on one request's surviving DRAM blocks (xLLM's per-host DRAM pool): the
    TE's process may be torn down for its replacement, the pinned host memory stays until it is
    released, pulled or its lease ends. It changes no state (it is its config), so it records
    nothing; a node loss would take it with its host."""

    def __init__(self, config: Any) -> None:
        self.cfg = config if isinstance(config, KeeperConfig) else msgspec.convert(config, KeeperConfig)

    def on_start(self, ctx: Context) -> None:
        ctx.after(self.cfg.keep_s, KeeperExpired(), key="lease")

    def handle(self, ctx: Context, msg: Message) -> None:
        c = self.cfg
        if isinstance(msg, KvExportAsk):
            n = len(c.hashes) if msg.hashes[: len(c.hashes)] == c.hashes else 0
            ctx.send(msg.reply_to, KvExportOffer(request_id=c.request_id, master=ctx.self, host=c.host, blocks=n,
                                                 block_bytes=c.block_bytes, tp=c.tp), corr=c.request_id)  # fmt: skip
        elif isinstance(msg, KvExportRelease | KeeperExpired):
            ctx.cancel("lease")
            ctx.stop()


def _start_import(m: DpMaster, ctx: Context, msg: KvImport) -> None:
    st, cfg = m.state, m.cfg
    seq = IMPORT_SEQ + msg.task_id
    have = rtc.match_by_prefix(st.rtc, msg.hashes).hbm_blocks
    need = len(msg.hashes) - len(have)
    why = ""
    if st.device_lost:
        why = f"device lost: {st.device_lost}"
    elif seq in st.rtc.seqs:
        why = f"an import for {msg.task_id!r} is already running here"
    elif need > 0 and not rtc.can_allocate(st.rtc, need, have):
        why = f"no room: {need} HBM blocks"
    if why or need <= 0:
        ctx.send(msg.reply_to, KvImported(request_id=msg.request_id, task_id=msg.task_id, ok=not why,
                                          te=cfg.te, reason=why or "the target caches them already"))  # fmt: skip
        return
    ctx.record(rtc.allocate(st.rtc, seq, need, shared=have))
    ranks = min(cfg.tp, msg.offer.tp, len(cfg.npus))
    conf = ImporterConfig(
        master=ctx.self, seq=seq, request_id=msg.request_id, task_id=msg.task_id, src_master=msg.offer.master,
        src_host=msg.offer.host, srcs=msg.offer.srcs[:ranks], dsts=cfg.npus[:ranks], hashes=msg.hashes, fabric=cfg.fabric,
        nbytes=need * msg.offer.block_bytes, reply_to=msg.reply_to, timeout_s=msg.timeout_s, skip=len(have),
    )  # fmt: skip
    ctx.spawn(f"{ctx.self}/kvimport/{msg.task_id}", KvImporter, config=msgspec.to_builtins(conf))


def _end_import(m: DpMaster, ctx: Context, msg: KvImportDone) -> None:
    st = m.state
    if msg.seq not in st.rtc.seqs:
        return
    blocks = len(st.rtc.seqs[msg.seq].blocks)
    if msg.ok:
        ev = rtc.cache_blocks(st.rtc, msg.seq, msg.hashes, blocks)
        if ev is not None:
            ctx.record(ev)
    ctx.record(rtc.free(st.rtc, msg.seq))  # indexed blocks stay in the prefix cache (LRU); the rest return
    moved = blocks - msg.skip if msg.ok else 0
    ctx.send(msg.reply_to, KvImported(request_id=msg.request_id, task_id=msg.task_id, ok=msg.ok, te=m.cfg.te,
                                      blocks=moved, nbytes=msg.nbytes, duration_s=msg.duration_s,
                                      reason=msg.reason), corr=msg.request_id)  # fmt: skip
    m.advance(ctx)


# ---- the importer: one per import, a child of the target master ----------------------------------


class ImporterConfig(msgspec.Struct, frozen=True, kw_only=True):
    master: str  # the target DP master (its parent)
    seq: str
    request_id: str
    task_id: str
    src_master: str
    src_host: str
    dsts: tuple[str, ...]  # the target's NPUs, one per TP rank
    hashes: tuple[int, ...]
    fabric: str
    nbytes: int  # per rank
    reply_to: str  # the JE
    timeout_s: float
    skip: int = 0  # leading blocks the target cached already (not moved)
    srcs: tuple[str, ...] = ()  # live: the source NPUs, one a rank ((): its host's DRAM)


class ImporterStarted(Event, frozen=True, kw_only=True):
    at_s: float


class ImporterPinned(Event, frozen=True, kw_only=True):
    blocks: int


class ImporterSent(Event, frozen=True, kw_only=True):
    parts: tuple[str, ...]
    relay: bool = False


class ImporterPartDone(Event, frozen=True, kw_only=True):
    part: str


class ImporterEnded(Event, frozen=True, kw_only=True):
    ok: bool
    reason: str = ""


class ImporterState(msgspec.Struct, kw_only=True):
    started_s: float = 0.0
    pending: list[str] = []
    relay: bool = False
    ended: bool = False


class ImporterTimeout(Message, frozen=True, kw_only=True):
    pass


def relay_path(src_host: str, dst_npu: str, npus_per_server: int = 8) -> tuple[str, ...] | None:
    """The link directions from `src_host`'s DRAM to `dst_npu` on another gen1 server through a
    neighbour NPU's RoCE NIC (RoCE first: the fabric charges the first link kind's setup)."""
    h, d = _HOST.match(src_host), _NPU.match(dst_npu)
    if h is None or d is None:
        return None
    s, t, j = int(h.group(1)), int(d.group(1)), int(d.group(2))
    k = (j + 1) % npus_per_server  # any NPU of the source server works; not the failed one's index
    return (f"s{s}/npu{k}/roce:tx", f"s{t}/npu{j}/roce:rx", f"s{s}/host/pcie:h2d", f"s{s}/npu{k}/pcie:h2d")


class KvImporter(Actor[ImporterState]):
    def __init__(self, config: Any) -> None:
        self.cfg = config if isinstance(config, ImporterConfig) else msgspec.convert(config, ImporterConfig)

    def initial_state(self) -> ImporterState:
        return ImporterState()

    def evolve(self, state: ImporterState, event: Event) -> ImporterState:
        if isinstance(event, ImporterStarted):
            state.started_s = event.at_s
        elif isinstance(event, ImporterPinned):
            pass
        elif isinstance(event, ImporterSent):
            state.pending, state.relay = list(event.parts), event.relay
        elif isinstance(event, ImporterPartDone):
            state.pending.remove(event.part)
        elif isinstance(event, ImporterEnded):
            state.ended = True
        return state

    def on_start(self, ctx: Context) -> None:
        c = self.cfg
        ctx.record(ImporterStarted(at_s=ctx.now()))
        ctx.send(c.src_master, KvExportAsk(request_id=c.request_id, hashes=c.hashes, reply_to=ctx.self, always=True,
                                           live=bool(c.srcs)))  # fmt: skip
        ctx.after(c.timeout_s, ImporterTimeout(), key="timeout")

    def handle(self, ctx: Context, msg: Message) -> None:
        st, c = self.state, self.cfg
        if st.ended:
            return
        if isinstance(msg, KvExportOffer):
            if msg.blocks < len(c.hashes):
                self._end(ctx, False, f"the source's host DRAM holds {msg.blocks} of {len(c.hashes)} blocks now")
                return
            ctx.record(ImporterPinned(blocks=msg.blocks))
            self._send(ctx, relay=False)
        elif isinstance(msg, Undelivered) and msg.target == c.src_master:
            self._end(ctx, False, f"the source {c.src_master} is gone ({msg.reason}): so is its host memory")
        elif isinstance(msg, LinkTransferDone) and msg.req_id in st.pending:
            ctx.record(ImporterPartDone(part=msg.req_id))
            if not self.state.pending:
                self._end(ctx, True)
        elif isinstance(msg, LinkTransferFailed) and msg.req_id in st.pending:
            if not st.relay and not c.srcs and "no host path" in msg.reason:
                self._send(ctx, relay=True)  # another gen1 server: through a neighbour's NIC
            else:
                self._end(ctx, False, f"transfer failed: {msg.reason}")
        elif isinstance(msg, ImporterTimeout):
            self._end(ctx, False, f"timed out after {c.timeout_s:g}s")

    def _send(self, ctx: Context, relay: bool) -> None:
        c = self.cfg
        parts = tuple(f"kvimp:{c.task_id}#{r}{'r' if relay else ''}" for r in range(len(c.dsts)))
        paths = [relay_path(c.src_host, d) if relay else () for d in c.dsts]
        if relay and any(p is None for p in paths):
            self._end(ctx, False, f"no path from {c.src_host} to {list(c.dsts)}")
            return
        ctx.record(ImporterSent(parts=parts, relay=relay))
        srcs = c.srcs or (c.src_host,) * len(c.dsts)
        for part, src, dst, path in zip(parts, srcs, c.dsts, paths, strict=True):
            ctx.send(c.fabric, LinkTransfer(req_id=part, src=src, dst=dst, nbytes=max(c.nbytes, 1), path=path or ()))

    def _end(self, ctx: Context, ok: bool, reason: str = "") -> None:
        c = self.cfg
        ctx.cancel("timeout")
        ctx.send(c.src_master, KvExportRelease(request_id=c.request_id))  # pulled (or given up): the host frees it
        ctx.record(ImporterEnded(ok=ok, reason=reason))
        nbytes = c.nbytes * len(c.dsts) if ok else 0
        ctx.send(c.master, KvImportDone(
            seq=c.seq, request_id=c.request_id, task_id=c.task_id, reply_to=c.reply_to, hashes=c.hashes, skip=c.skip,
            ok=ok, reason=reason, nbytes=nbytes, duration_s=ctx.now() - self.state.started_s))  # fmt: skip
        ctx.stop()  # its work is done (a master that died meanwhile leaves nobody to stop it)
