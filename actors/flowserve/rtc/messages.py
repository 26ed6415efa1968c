"""The Table-1 API of the Relational Tensor Cache as messages (DeepServe §4.3, Table 1).

Requests carry a caller-chosen `req_id`; the answer echoes it and is sent as a reply to the
request's envelope, so `ctx.ask` works. Any request the RTC cannot honour is answered
`RtcRefused(reason)`; nothing is dropped.

| Table 1            | request              | answer                                    |
| ------------------ | -------------------- | ----------------------------------------- |
| MatchByPrefixToken | `MatchByPrefixToken` | `Matched`                                 |
| MatchByID          | `MatchByID`          | `Matched` (with the cache's hashes)       |
| Populate           | `Populate`           | `CopyAccepted`, later `CopyDone`          |
| QueryPopulate      | `QueryPopulate`      | `PopulateStatus`                          |
| AllocBlocks        | `AllocBlocks`        | `BlocksAllocated`                         |
| AppendBlock        | `AppendBlock`        | `BlocksAllocated`                         |
| Copy               | `Copy`               | `CopyAccepted`, later `CopyDone`          |
| Free               | `Free`               | `Freed`                                   |

Added (vLLM's `cache_full_blocks`, DeepServe's context-caching endpoint): `CacheBlocks`,
`CreateCache`, `DeleteCache`. Between the RTC master and its executor: `ExecuteCopy` /
`CopyExecuted` and the executor's `KvReserved`.
"""

from __future__ import annotations

from deepserve.core.messages import Message

# ---- requests ---------------------------------------------------------------------


class MatchByPrefixToken(Message, frozen=True, kw_only=True):
    """Find preserved KV by a prompt's chain block hashes (`Prompt.block_hashes`)."""

    req_id: str
    block_hashes: tuple[int, ...]


class MatchByID(Message, frozen=True, kw_only=True):
    req_id: str
    cache_id: str


class Populate(Message, frozen=True, kw_only=True):
    """Fetch the DRAM part of a prompt's cached prefix into HBM. With `seq`, that sequence takes
    the whole prefix (it may allocate more after `CopyDone`); without, a background prefetch."""

    req_id: str
    block_hashes: tuple[int, ...]
    seq: str | None = None


class QueryPopulate(Message, frozen=True, kw_only=True):
    req_id: str
    copy_id: str


class AllocBlocks(Message, frozen=True, kw_only=True):
    """Blocks for prefill: `shared` (a prefix hit, `Matched.hbm_blocks`) then `num_blocks` fresh."""

    req_id: str
    seq: str
    num_blocks: int
    shared: tuple[int, ...] = ()


class AppendBlock(Message, frozen=True, kw_only=True):
    """One more block for a decoding sequence."""

    req_id: str
    seq: str


class Copy(Message, frozen=True, kw_only=True):
    """Copy indexed blocks from NPU HBM to DRAM (they stay in HBM until evicted)."""

    req_id: str
    block_hashes: tuple[int, ...]


class Free(Message, frozen=True, kw_only=True):
    req_id: str
    seq: str


class CacheBlocks(Message, frozen=True, kw_only=True):
    """`seq`'s full blocks are computed: index them under `block_hashes` (the chain so far)."""

    req_id: str
    seq: str
    block_hashes: tuple[int, ...]


class CreateCache(Message, frozen=True, kw_only=True):
    """Explicit context caching: name `seq`'s computed prefix `cache_id` (holds its blocks)."""

    req_id: str
    cache_id: str
    seq: str
    block_hashes: tuple[int, ...]


class DeleteCache(Message, frozen=True, kw_only=True):
    req_id: str
    cache_id: str


# ---- answers ----------------------------------------------------------------------


class Matched(Message, frozen=True, kw_only=True):
    req_id: str
    hbm_blocks: tuple[int, ...]
    dram_blocks: tuple[int, ...] = ()
    block_hashes: tuple[int, ...] = ()  # MatchByID: the named cache's chain
    block_tokens: int = 0


class BlocksAllocated(Message, frozen=True, kw_only=True):
    req_id: str
    seq: str
    blocks: tuple[int, ...]  # the sequence's whole block table, in token order


class BlocksCached(Message, frozen=True, kw_only=True):
    req_id: str
    seq: str
    num_cached: int


class Freed(Message, frozen=True, kw_only=True):
    req_id: str
    seq: str


class CopyAccepted(Message, frozen=True, kw_only=True):
    """A copy started (`copy_id`), or nothing to copy (`copy_id` None, `num_blocks` 0)."""

    req_id: str
    copy_id: str | None
    num_blocks: int


class CopyDone(Message, frozen=True, kw_only=True):
    """Sent to whoever asked for the copy when it ends (the sched-enqueue notification)."""

    copy_id: str
    ok: bool
    reason: str = ""


class PopulateStatus(Message, frozen=True, kw_only=True):
    req_id: str
    copy_id: str
    status: str  # "pending", "done", "failed", "unknown"


class CacheCreated(Message, frozen=True, kw_only=True):
    req_id: str
    cache_id: str
    num_blocks: int


class CacheDeleted(Message, frozen=True, kw_only=True):
    req_id: str
    cache_id: str


class RtcRefused(Message, frozen=True, kw_only=True):
    req_id: str
    reason: str


# ---- master <-> executor ------------------------------------------------------------------


class ExecuteCopy(Message, frozen=True, kw_only=True):
    """Move `num_blocks` blocks between tiers on every NPU of the group (one rank's shard each).
    `hbm`/`dram` are the block ids (raw addresses are block id x block bytes in the region)."""

    copy_id: str
    kind: str  # "swap_out": HBM -> DRAM; "populate" / "prefetch": DRAM -> HBM
    hbm: tuple[int, ...]
    dram: tuple[int, ...]


class CopyExecuted(Message, frozen=True, kw_only=True):
    copy_id: str
    ok: bool
    reason: str = ""
    duration_s: float = 0.0


class KvReserved(Message, frozen=True, kw_only=True):
    """The executor reserved (or failed to reserve) the KV region on its NPUs."""

    ok: bool
    npus: tuple[str, ...]
    region_bytes: int
    reason: str = ""


RTC_REQUESTS = (
    MatchByPrefixToken, MatchByID, Populate, QueryPopulate, AllocBlocks, AppendBlock, Copy, Free,
    CacheBlocks, CreateCache, DeleteCache,
)
