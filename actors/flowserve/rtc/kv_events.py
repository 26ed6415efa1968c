"""KV cache events in vLLM's shape, so a router (ours — issue 6's global prompt tree — or an
outside one that speaks vLLM's `vllm.distributed.kv_events`) can mirror an RTC's index.

The field names and meanings follow vLLM v1: `BlockStored(block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium)`, `BlockRemoved(block_hashes, medium)`,
`AllBlocksCleared()`, batched in `KVEventBatch(ts, events, data_parallel_rank)`. Two
differences, both forced by deepserve's prompts carrying chain hashes instead of tokens:
`token_ids` is empty (the chain hash is the key), and `medium` names our tiers ("HBM",
"DRAM") where vLLM says "GPU"/"CPU". Events are derived from the RTC's own recorded events by the
pure `kv_events_of`, so publishing them needs no extra state.
"""

from __future__ import annotations

import msgspec

from deepserve.core.messages import Message

from .events import (
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcBlocksMasked,
    RtcCleared,
    RtcCopyFinished,
    RtcCopyStarted,
)
from .state import DRAM, HBM, NONE, Rtc


class BlockStored(msgspec.Struct, frozen=True, tag=True, omit_defaults=True, gc=False):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None


class BlockRemoved(msgspec.Struct, frozen=True, tag=True, omit_defaults=True, gc=False):
    block_hashes: tuple[int, ...]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True, tag=True, gc=False):
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(Message, frozen=True, kw_only=True):
    """What an RTC sends to its subscribers after each change (one batch per recorded event)."""

    ts: float
    events: tuple[KVCacheEvent, ...]
    data_parallel_rank: int | None = None


def _stored(hashes: tuple[int, ...], parents: tuple[int | None, ...], block_size: int,
            medium: str) -> list[KVCacheEvent]:
    """One BlockStored per chain run (each block's parent is the previous block's hash)."""
    out: list[KVCacheEvent] = []
    i, n = 0, len(hashes)
    while i < n:
        j = i + 1
        while j < n and parents[j] == hashes[j - 1]:
            j += 1
        out.append(BlockStored(block_hashes=hashes[i:j], parent_block_hash=parents[i],
                               token_ids=(), block_size=block_size, medium=medium))
        i = j
    return out


def kv_events_of(event: object, block_size: int) -> list[KVCacheEvent]:
    """The KV cache events one recorded RTC event implies ([] for most block-table changes)."""
    t = type(event)
    if t is RtcBlocksAllocated:
        ev: object = event
        return [BlockRemoved(block_hashes=ev.evicted, medium=HBM)] if ev.evicted else []  # type: ignore[attr-defined]
    if t is RtcBlocksCached:
        c: RtcBlocksCached = event  # type: ignore[assignment]
        return _stored(c.hashes, c.parents, block_size, HBM) if c.hashes else []
    if t is RtcCopyStarted:
        s: RtcCopyStarted = event  # type: ignore[assignment]
        out: list[KVCacheEvent] = []
        if s.evicted_hbm:
            out.append(BlockRemoved(block_hashes=s.evicted_hbm, medium=HBM))
        if s.evicted_dram:
            out.append(BlockRemoved(block_hashes=s.evicted_dram, medium=DRAM))
        return out
    if t is RtcCopyFinished:
        f: RtcCopyFinished = event  # type: ignore[assignment]
        return _stored(f.stored, f.parents, block_size, f.medium) if f.stored else []
    if t is RtcCleared:
        return [AllBlocksCleared()]
    if t is RtcBlocksMasked:
        m: RtcBlocksMasked = event  # type: ignore[assignment]
        return [BlockRemoved(block_hashes=m.evicted, medium=HBM)] if m.evicted else []
    return []


def kv_event_batch(event: object, block_size: int, ts: float,
                   dp_rank: int | None = None) -> KVEventBatch | None:
    """The batch to publish after recording `event` (None when it implies no KV event)."""
    kv = kv_events_of(event, block_size)
    return KVEventBatch(ts=ts, events=tuple(kv), data_parallel_rank=dp_rank) if kv else None


# ---- the mirror ------------------------------------------------------------------------

View = dict[int, tuple[int | None, bool, bool]]  # chain hash -> (parent, in HBM, in DRAM)


class Mirror:
    """A router's copy of one RTC's index, folded from its KV events only: a prefix tree over
    chain hashes with the tiers each block is in. Pure bookkeeping; `view()` compares with
    `index_view(rtc)`."""

    __slots__ = ("nodes",)

    def __init__(self) -> None:
        self.nodes: dict[int, list] = {}  # hash -> [parent, set of media]

    def fold(self, event: KVCacheEvent) -> None:
        t = type(event)
        if t is BlockStored:
            parent = event.parent_block_hash  # type: ignore[union-attr]
            for h in event.block_hashes:  # type: ignore[union-attr]
                node = self.nodes.get(h)
                if node is None:
                    self.nodes[h] = [parent, {event.medium}]  # type: ignore[union-attr]
                else:
                    node[1].add(event.medium)  # type: ignore[union-attr]
                parent = h
        elif t is BlockRemoved:
            for h in event.block_hashes:  # type: ignore[union-attr]
                node = self.nodes.get(h)
                if node is None:
                    continue  # a removal we never saw stored (joined late): nothing to drop
                node[1].discard(event.medium)  # type: ignore[union-attr]
                if not node[1]:
                    del self.nodes[h]
        elif t is AllBlocksCleared:
            self.nodes.clear()
        else:
            raise TypeError(f"not a KV cache event: {t.__name__}")

    def match(self, block_hashes: tuple[int, ...] | list[int]) -> int:
        """How many leading blocks of a prompt the mirrored RTC has cached (any tier)."""
        n = 0
        for h in block_hashes:
            if h not in self.nodes:
                break
            n += 1
        return n

    def match_tiers(self, block_hashes: tuple[int, ...] | list[int]) -> tuple[int, int]:
        """(blocks in the leading HBM run, blocks in the DRAM run after it): the lengths of the
        mirrored RTC's `match_by_prefix`, for a router's cost model."""
        nodes, i, n = self.nodes, 0, len(block_hashes)
        while i < n and (node := nodes.get(block_hashes[i])) is not None and HBM in node[1]:
            i += 1
        j = i
        while j < n and (node := nodes.get(block_hashes[j])) is not None and DRAM in node[1]:
            j += 1
        return i, j - i

    def view(self) -> View:
        return {h: (p, HBM in m, DRAM in m) for h, (p, m) in self.nodes.items()}


def index_view(rtc: Rtc) -> View:
    """The RTC's index in the mirror's terms."""
    return {h: (n.parent, n.hbm != NONE, n.dram != NONE) for h, n in rtc.nodes.items()}
