"""The RTC master's events: every change of the block pool and the index, as facts.

Each event names exactly which blocks changed hands (the decision functions in `master` pick
them), so the log reads on its own and `kv_events.kv_events_of` turns any of them into vLLM-shape
KV cache events without looking at the state. `apply.apply` folds them into the `Rtc` in place.
"""

from __future__ import annotations

from deepserve.core.messages import Event


class RtcBlocksAllocated(Event, frozen=True, kw_only=True):
    """`seq` now also holds `shared` (cached blocks it reuses: prefix hit) and `blocks` (fresh).
    `evicted` are the chain hashes whose HBM copies were dropped to free some of `blocks`."""

    seq: str
    shared: tuple[int, ...] = ()
    blocks: tuple[int, ...] = ()
    evicted: tuple[int, ...] = ()


class RtcBlocksCached(Event, frozen=True, kw_only=True):
    """`seq`'s blocks from table index `start` are full and computed: the newly indexed ones are
    `blocks[i]` under `hashes[i]` (parent `parents[i]`); `num_cached` is the table's new mark.
    A hash already in HBM is not indexed twice (its block stays private to `seq`)."""

    seq: str
    num_cached: int
    blocks: tuple[int, ...] = ()
    hashes: tuple[int, ...] = ()
    parents: tuple[int | None, ...] = ()


class RtcFreed(Event, frozen=True, kw_only=True):
    """`seq` released its whole block table (finished, cancelled or preempted)."""

    seq: str


class RtcCopyStarted(Event, frozen=True, kw_only=True):
    """A copy between tiers begins.

    - `swap_out` (Table 1 `Copy`, and background swap-out): HBM `hbm[i]` -> DRAM `dram[i]`.
    - `populate` (Table 1 `Populate`, for `seq`) and `prefetch` (background): DRAM -> HBM; the
      fresh HBM blocks are `hbm`; `shared` are HBM-resident blocks of the prefix that `seq` takes
      a reference on at once.
    `evicted_hbm` / `evicted_dram`: chain hashes whose copy in that tier was dropped for room."""

    copy_id: str
    kind: str
    seq: str | None = None
    hashes: tuple[int, ...] = ()
    parents: tuple[int | None, ...] = ()
    hbm: tuple[int, ...] = ()
    dram: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()
    evicted_hbm: tuple[int, ...] = ()
    evicted_dram: tuple[int, ...] = ()


class RtcCopyFinished(Event, frozen=True, kw_only=True):
    """The copy ended. On success the destination copies are indexed (`stored`: the hashes that
    gained a copy; a hash that got one meanwhile by another path is not indexed twice); on
    failure the destination blocks are released and nothing is indexed."""

    copy_id: str
    ok: bool
    medium: str  # the destination tier: "DRAM" (swap-out) or "HBM" (populate, prefetch)
    stored: tuple[int, ...] = ()
    parents: tuple[int | None, ...] = ()
    reason: str = ""


class RtcCacheCreated(Event, frozen=True, kw_only=True):
    """A named context cache (ID index) now holds a reference on `blocks` (chain `hashes`)."""

    cache_id: str
    hashes: tuple[int, ...]
    blocks: tuple[int, ...]


class RtcCacheDeleted(Event, frozen=True, kw_only=True):
    cache_id: str


class RtcCleared(Event, frozen=True, kw_only=True):
    """Everything is gone (device reset: HBM contents lost; DRAM dropped with it): all tables,
    caches, copies and index nodes. Holders must treat their sequences as failed."""

    reason: str


class RtcBlocksMasked(Event, frozen=True, kw_only=True):
    """HBM fault masking (xDeepServe §6.2 stage 3): `blocks` sat in a faulty part of HBM and
    leave the pool for good — free or cached ones (`evicted`: the chain hashes of the cached
    KV dropped with them). The mask holds them as a named cache of no content (`MASK`), so
    free + cached + referenced = capacity still adds up and the capacity that serves shrinks."""

    blocks: tuple[int, ...]
    evicted: tuple[int, ...] = ()
    reason: str = ""


RTC_EVENTS = (
    RtcBlocksMasked,
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcFreed,
    RtcCopyStarted,
    RtcCopyFinished,
    RtcCacheCreated,
    RtcCacheDeleted,
    RtcCleared,
)
RtcEvent = (
    RtcBlocksMasked
    | RtcBlocksAllocated
    | RtcBlocksCached
    | RtcFreed
    | RtcCopyStarted
    | RtcCopyFinished
    | RtcCacheCreated
    | RtcCacheDeleted
    | RtcCleared
)

