"""RTC — the Relational Tensor Cache (DeepServe §4.3, Table 1), one per DP group.

Usage from the DP-group master (the RTC master is embedded in the master's state)::

    from deepserve.actors.flowserve import rtc

    state.rtc = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=N, dram_blocks=M, block_tokens=B))

    # in evolve(state, event):   (ALL RTC changes go through recorded events, applied in place)
    if rtc.is_rtc_event(event):
        rtc.apply(state.rtc, event)
        return state

    # in handle(ctx, msg) — reads are free, decisions return an event you record:
    m = rtc.match_by_prefix(state.rtc, prompt.block_hashes)       # Match(hbm_blocks, dram_blocks)
    if m.dram_blocks and cost_model_says_load and rtc.can_allocate(state.rtc, len(m.dram_blocks),
                                                                   m.hbm_blocks):
        ev = rtc.populate(state.rtc, seq, prompt.block_hashes, m)  # RtcCopyStarted
        ctx.record(ev)
        ctx.send(executor, ExecuteCopy(copy_id=ev.copy_id, kind=ev.kind, hbm=ev.hbm, dram=ev.dram))
        # ... on CopyExecuted(copy_id, ok) from the RtcExecutor (or your own LinkTransfer answer):
        ctx.record(rtc.finish_copy(state.rtc, ev.copy_id, ok))     # seq's table = prefix, computed
    need = blocks_for(prompt.num_tokens) - len(m.hbm_blocks)
    if rtc.can_allocate(state.rtc, need, m.hbm_blocks):
        ctx.record(rtc.allocate(state.rtc, seq, need, shared=m.hbm_blocks))  # AllocBlocks
    rtc.block_table(state.rtc, seq)          # HBM block ids in token order
    ...after a forward that filled blocks:
    ev = rtc.cache_blocks(state.rtc, seq, prompt.block_hashes, num_blocks=full)  # index (or None)
    if ev: ctx.record(ev)
    ctx.record(rtc.append_block(state.rtc, seq))   # decode: AppendBlock (check can_allocate(1))
    ctx.record(rtc.free(state.rtc, seq))           # Free (finish, cancel, preempt)
    ev = rtc.plan_swap_out(state.rtc)              # background swap-out, once per step (or None)
    ev = rtc.plan_prefetch(state.rtc, [r.prompt.block_hashes for r in waiting])  # background prefetch

    # KV events for a router (issue 6's global prompt tree, or any vLLM-KV-event consumer), after
    # each ctx.record(ev) of an RTC event:
    batch = rtc.kv_event_batch(ev, block_tokens, ctx.now(), dp_rank)   # KVEventBatch or None
    if batch: ctx.send(router, batch)      # the router folds batch.events into an rtc.Mirror

Cached prompt tokens of a hit: `len(m.hbm_blocks) * block_tokens` (plus the populated run).
Callers outside the DP master (TE-shell context caching, tests) use `RtcActor` and the Table-1
messages in `rtc.messages`. The executor (`rtc.executor`) owns the HBM "kv" region and the copies.
"""

from __future__ import annotations

from .apply import POPULATE, PREFETCH, SWAP_OUT, apply, is_rtc_event
from .events import (
    RTC_EVENTS,
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcBlocksMasked,
    RtcCacheCreated,
    RtcCacheDeleted,
    RtcCleared,
    RtcCopyFinished,
    RtcCopyStarted,
    RtcEvent,
    RtcFreed,
)
from .kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    Mirror,
    index_view,
    kv_event_batch,
    kv_events_of,
)
from .master import (
    NO_MATCH,
    Match,
    allocate,
    append_block,
    block_table,
    cache_blocks,
    can_allocate,
    clear,
    copy_status,
    create_cache,
    delete_cache,
    free,
    is_loading,
    mask_blocks,
    match_by_id,
    match_by_prefix,
)
from .pool import Diverged
from .state import (
    DRAM,
    HBM,
    MASK,
    Rtc,
    RtcConfig,
    RtcError,
    hbm_free_blocks,
    hbm_used_blocks,
    kv_usage,
    lru_blocks,
    lru_order,
    new_rtc,
)
from .tiers import copy_to_dram, finish_copy, plan_prefetch, plan_swap_out, populate, prefetch

__all__ = [
    "DRAM", "HBM", "MASK", "NO_MATCH", "POPULATE", "PREFETCH", "RTC_EVENTS", "SWAP_OUT",
    "AllBlocksCleared", "BlockRemoved", "BlockStored", "Diverged", "KVEventBatch", "Match",
    "Mirror", "Rtc", "RtcBlocksAllocated", "RtcBlocksCached", "RtcBlocksMasked", "RtcCacheCreated",
    "RtcCacheDeleted", "RtcCleared", "RtcConfig", "RtcCopyFinished", "RtcCopyStarted",
    "RtcError", "RtcEvent", "RtcFreed",
    "allocate", "append_block", "apply", "block_table", "cache_blocks", "can_allocate", "clear",
    "copy_status", "copy_to_dram", "create_cache", "delete_cache", "finish_copy", "free",
    "hbm_free_blocks", "hbm_used_blocks", "index_view", "is_loading", "is_rtc_event",
    "kv_event_batch", "kv_events_of", "kv_usage", "mask_blocks", "lru_blocks", "lru_order", "match_by_id", "match_by_prefix", "new_rtc", "plan_prefetch", "plan_swap_out",
    "populate", "prefetch",
]
