"""`RtcActor`: the RTC master as an actor, for callers outside a DP master (the TE shell's
context-caching endpoints, embedders, tests). The DP master embeds the same pure `Rtc` in its
own state instead and calls the functions of `master` directly (no message per call).

Every Table-1 request is answered (a refusal names the reason); every change is a recorded RTC
event applied by `apply` in `evolve`; after each change the implied vLLM-shape KV events go to the
subscribers as one `KVEventBatch`. Copies between tiers go to the executor (`RtcExecutor`); with
`executor=None` there is no device memory behind the RTC (bookkeeping only: tests, what-if
studies), and a copy completes in the handler that started it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.core.actor import Actor
from deepserve.core.context import Context
from deepserve.core.messages import Event, Message

from . import master as M
from . import tiers as T
from .apply import apply, is_rtc_event
from .events import RtcCopyFinished, RtcCopyStarted
from .kv_events import kv_event_batch
from .messages import (
    AllocBlocks,
    AppendBlock,
    BlocksAllocated,
    BlocksCached,
    CacheBlocks,
    CacheCreated,
    CacheDeleted,
    Copy,
    CopyAccepted,
    CopyDone,
    CopyExecuted,
    CreateCache,
    DeleteCache,
    ExecuteCopy,
    Free,
    Freed,
    KvReserved,
    MatchByID,
    MatchByPrefixToken,
    Matched,
    Populate,
    PopulateStatus,
    QueryPopulate,
    RtcRefused,
)
from .state import Rtc, RtcConfig, RtcError, new_rtc


class RtcActorState(msgspec.Struct):
    rtc: Rtc
    watchers: dict[str, str] = {}  # copy id -> who gets its CopyDone
    device: str = ""  # the executor's KV reservation failure, if any


class CopyWatched(Event, frozen=True, kw_only=True):
    copy_id: str
    addr: str


class DeviceReservation(Event, frozen=True, kw_only=True):
    ok: bool
    reason: str = ""


class RtcActor(Actor[RtcActorState]):
    def __init__(self, config: Any, executor: str | None = None, subscribers: list[str] | None = None,
                 dp_rank: int | None = None) -> None:  # fmt: skip
        self.config = config if isinstance(config, RtcConfig) else msgspec.convert(config, RtcConfig)
        self.executor, self.subscribers, self.dp_rank = executor, tuple(subscribers or ()), dp_rank

    def initial_state(self) -> RtcActorState:
        return RtcActorState(rtc=new_rtc(self.config))

    def evolve(self, s: RtcActorState, e: Event) -> RtcActorState:
        if is_rtc_event(e):
            apply(s.rtc, e)
            if isinstance(e, RtcCopyFinished):
                s.watchers.pop(e.copy_id, None)
        elif isinstance(e, CopyWatched):
            s.watchers[e.copy_id] = e.addr
        elif isinstance(e, DeviceReservation):
            s.device = "" if e.ok else e.reason
        return s

    # ---- recording ------------------------------------------------------------------
    def _record(self, ctx: Context, ev: Event) -> None:
        ctx.record(ev)
        if self.subscribers:
            batch = kv_event_batch(ev, self.config.block_tokens, ctx.now(), self.dp_rank)
            if batch is not None:
                for sub in self.subscribers:
                    ctx.send(sub, batch)

    def _start_copy(self, ctx: Context, ev: RtcCopyStarted, watcher: str | None) -> None:
        self._record(ctx, ev)
        if watcher is not None:
            ctx.record(CopyWatched(copy_id=ev.copy_id, addr=watcher))
        if self.executor is None:
            self._finish(ctx, ev.copy_id, True, "")
        else:
            ctx.send(self.executor, ExecuteCopy(copy_id=ev.copy_id, kind=ev.kind, hbm=ev.hbm, dram=ev.dram))

    def _finish(self, ctx: Context, copy_id: str, ok: bool, reason: str) -> None:
        st = self.state
        if copy_id not in st.rtc.copies:
            return  # the RTC was cleared while the bytes moved
        watcher = st.watchers.get(copy_id)
        self._record(ctx, T.finish_copy(st.rtc, copy_id, ok, reason))
        if watcher is not None:
            ctx.send(watcher, CopyDone(copy_id=copy_id, ok=ok, reason=reason))

    def _background(self, ctx: Context) -> None:
        """Background swap-out after a change that may have raised the pressure."""
        ev = T.plan_swap_out(self.state.rtc)
        if ev is not None:
            self._start_copy(ctx, ev, None)

    # ---- requests ---------------------------------------------------------------------
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, CopyExecuted):
            self._finish(ctx, msg.copy_id, msg.ok, msg.reason)
            return
        if isinstance(msg, KvReserved):
            ctx.record(DeviceReservation(ok=msg.ok, reason=msg.reason))
            return
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            return
        try:
            handler(self, ctx, msg)
        except RtcError as exc:
            ctx.reply(RtcRefused(req_id=msg.req_id, reason=str(exc)))  # type: ignore[attr-defined]

    def _match_prefix(self, ctx: Context, msg: MatchByPrefixToken) -> None:
        m = M.match_by_prefix(self.state.rtc, msg.block_hashes)
        ctx.reply(Matched(req_id=msg.req_id, hbm_blocks=m.hbm_blocks, dram_blocks=m.dram_blocks,
                          block_tokens=self.config.block_tokens))  # fmt: skip

    def _match_id(self, ctx: Context, msg: MatchByID) -> None:
        found = M.match_by_id(self.state.rtc, msg.cache_id)
        if found is None:
            raise RtcError(f"unknown context cache {msg.cache_id!r}")
        hashes, m = found
        ctx.reply(Matched(req_id=msg.req_id, hbm_blocks=m.hbm_blocks, block_hashes=hashes,
                          block_tokens=self.config.block_tokens))  # fmt: skip

    def _alloc(self, ctx: Context, msg: AllocBlocks | AppendBlock) -> None:
        r = self.state.rtc
        if self.state.device:
            raise RtcError(f"no KV memory on the device: {self.state.device}")
        if isinstance(msg, AppendBlock):
            ev = M.append_block(r, msg.seq)
        else:
            ev = M.allocate(r, msg.seq, msg.num_blocks, msg.shared)
        self._record(ctx, ev)
        ctx.reply(BlocksAllocated(req_id=msg.req_id, seq=msg.seq, blocks=tuple(M.block_table(r, msg.seq))))
        self._background(ctx)

    def _cache(self, ctx: Context, msg: CacheBlocks) -> None:
        ev = M.cache_blocks(self.state.rtc, msg.seq, msg.block_hashes)
        if ev is not None:
            self._record(ctx, ev)
        ctx.reply(BlocksCached(req_id=msg.req_id, seq=msg.seq, num_cached=self.state.rtc.seqs[msg.seq].num_cached))

    def _free(self, ctx: Context, msg: Free) -> None:
        self._record(ctx, M.free(self.state.rtc, msg.seq))
        ctx.reply(Freed(req_id=msg.req_id, seq=msg.seq))

    def _populate(self, ctx: Context, msg: Populate) -> None:
        r = self.state.rtc
        m = M.match_by_prefix(r, msg.block_hashes)
        if m.dram_blocks and not M.can_allocate(r, len(m.dram_blocks), m.hbm_blocks):
            raise RtcError(f"out of HBM blocks: {len(m.dram_blocks)} needed to populate")
        ev = T.populate(r, msg.seq, msg.block_hashes, m)
        if ev is None:
            ctx.reply(CopyAccepted(req_id=msg.req_id, copy_id=None, num_blocks=0))
            return
        ctx.reply(CopyAccepted(req_id=msg.req_id, copy_id=ev.copy_id, num_blocks=len(ev.hbm)))
        self._start_copy(ctx, ev, ctx.sender)

    def _copy(self, ctx: Context, msg: Copy) -> None:
        ev = T.copy_to_dram(self.state.rtc, msg.block_hashes)
        if ev is None:
            ctx.reply(CopyAccepted(req_id=msg.req_id, copy_id=None, num_blocks=0))
            return
        ctx.reply(CopyAccepted(req_id=msg.req_id, copy_id=ev.copy_id, num_blocks=len(ev.hbm)))
        self._start_copy(ctx, ev, ctx.sender)

    def _query(self, ctx: Context, msg: QueryPopulate) -> None:
        status = M.copy_status(self.state.rtc, msg.copy_id)
        ctx.reply(PopulateStatus(req_id=msg.req_id, copy_id=msg.copy_id, status=status))

    def _create(self, ctx: Context, msg: CreateCache) -> None:
        ev = M.create_cache(self.state.rtc, msg.cache_id, msg.seq, msg.block_hashes)
        self._record(ctx, ev)
        ctx.reply(CacheCreated(req_id=msg.req_id, cache_id=msg.cache_id, num_blocks=len(ev.blocks)))

    def _delete(self, ctx: Context, msg: DeleteCache) -> None:
        self._record(ctx, M.delete_cache(self.state.rtc, msg.cache_id))
        ctx.reply(CacheDeleted(req_id=msg.req_id, cache_id=msg.cache_id))


_HANDLERS: dict[type, Any] = {
    MatchByPrefixToken: RtcActor._match_prefix,
    MatchByID: RtcActor._match_id,
    AllocBlocks: RtcActor._alloc,
    AppendBlock: RtcActor._alloc,
    CacheBlocks: RtcActor._cache,
    Free: RtcActor._free,
    Populate: RtcActor._populate,
    Copy: RtcActor._copy,
    QueryPopulate: RtcActor._query,
    CreateCache: RtcActor._create,
    DeleteCache: RtcActor._delete,
}
