"""The RTC master's state: the paged block table, reference counts, the hybrid index, the tiers.

Everything here is plain lists, dicts and mutable msgspec Structs so that the state is
msgpack-encodable (actor snapshots) and cheap to read on the scheduler's hot path.

- HBM blocks `0..hbm_blocks-1` and DRAM blocks `0..dram_blocks-1` are two separate pools.
- `ref[b]` counts the holders of HBM block b: sequences, named caches and copies in flight.
- An HBM block with `ref == 0` is either *free* (no content: `free_hbm`, a stack) or *cached*
  (it holds the KV of an indexed block: the LRU, least recently used first). Allocation takes
  free blocks first, then evicts from the LRU front (vLLM's block pool keeps a single queue;
  preferring never-cached blocks keeps the cache longer at the same cost). The LRU is two
  insertion-ordered dicts, `lru_order`: `cold_hbm` (blocks safe in DRAM, released by a swap-out:
  evicted first, the latest first) read backwards, then `lru_hbm`. Both only ever append and
  delete, so a dict's stored order is its LRU order: msgpack encodes a dict in the order it
  stores its keys, which an OrderedDict's `move_to_end(last=False)` does not change (one LRU
  with the cold blocks moved to its front logged snapshots in the wrong order). All three LRU
  dicts (`lru_dram` too) are plain dicts: an OrderedDict's moves cost twice a dict's.
- The prefix index (DeepServe's radix tree over token blocks) is `nodes`, keyed by the block's
  64-bit *chain hash* (`Prompt.block_hashes`): a chain hash names its whole prefix, so the tree is
  stored as a parent-pointer table and a prefix walk is one dict lookup per block. A node points
  at its HBM copy, its DRAM copy, or both (DeepServe §4.3: "each index node can point to data
  stored either in the NPU or in local DRAM").
- The ID index (explicit context caching) maps a cache id to the chain hashes it pins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from itertools import chain, compress
from typing import TYPE_CHECKING

import msgspec

NONE = -1  # "no block" in the int fields below (cheaper than Optional on the hot path)
_UNMARKED = -2  # apply._swap_out_started: a block the memo has no mark for
_NOT = bytes([1, 0]) + bytes(254)  # saved flags -> unsaved flags (bytes.translate)

MASK = "~hbm-masked"  # the named cache holding masked HBM blocks (apply._masked); no context id
HBM = "HBM"  # KV-event medium names (vLLM uses "GPU"/"CPU"; ours are the NPU's tiers)
DRAM = "DRAM"


class RtcConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sizes of one DP group's KV pools (block counts, not bytes: the executor converts)."""

    hbm_blocks: int
    dram_blocks: int = 0
    block_tokens: int = 128  # tokens per block (one cluster-wide size, `kv_block_tokens`)
    max_seqs: int = 65_536  # limits on everything: owners of block tables
    max_named_caches: int = 4_096
    max_copies_in_flight: int = 1_024
    swap_low_watermark: float = 0.10  # swap cold blocks out when less than this HBM is free
    swap_batch_blocks: int = 64  # at most this many blocks per background swap-out
    # at least this many per swap-out, unless the coldest unsaved block is about to be evicted
    # (fewer, larger copies: each costs the fabric and the log a few messages whatever its size)
    swap_min_blocks: int = 1
    prefetch_min_free: float = 0.25  # background prefetch only while more HBM than this is free
    prefetch_scan: int = 16  # queued prompts a prefetch plan looks at

    def __post_init__(self) -> None:
        if self.hbm_blocks <= 0:
            raise ValueError(f"RtcConfig.hbm_blocks must be > 0, got {self.hbm_blocks}")
        if self.dram_blocks < 0:
            raise ValueError(f"RtcConfig.dram_blocks must be >= 0, got {self.dram_blocks}")
        if self.block_tokens <= 0:
            raise ValueError(f"RtcConfig.block_tokens must be > 0, got {self.block_tokens}")
        if not 0.0 <= self.prefetch_min_free < 1.0:
            raise ValueError(
                f"RtcConfig.prefetch_min_free must be in [0, 1), got {self.prefetch_min_free}"
            )
        if not 0.0 <= self.swap_low_watermark < 1.0:
            raise ValueError(
                f"RtcConfig.swap_low_watermark must be in [0, 1), got {self.swap_low_watermark}"
            )
        for name in ("max_seqs", "max_named_caches", "max_copies_in_flight", "swap_batch_blocks",
                     "swap_min_blocks", "prefetch_scan"):
            if getattr(self, name) <= 0:
                raise ValueError(f"RtcConfig.{name} must be > 0, got {getattr(self, name)}")


class Node(msgspec.Struct, gc=False, array_like=True):
    """One indexed block: its parent's chain hash and where its KV lives."""

    parent: int | None
    hbm: int = NONE  # HBM block id, or NONE
    dram: int = NONE  # DRAM block id, or NONE


class SeqBlocks(msgspec.Struct, gc=False, array_like=True):
    """A sequence's block table: HBM block ids in token order; the first `num_cached` are indexed."""

    blocks: list[int]
    num_cached: int = 0
    loading: int = 0  # copies in flight that fill blocks of this table (populate)


class NamedCache(msgspec.Struct, gc=False, array_like=True):
    """An explicit context cache: the chain hashes and the HBM blocks it holds a reference on."""

    hashes: list[int]
    blocks: list[int]


class CopyOp(msgspec.Struct, gc=False, array_like=True):
    """A copy in flight between tiers. It holds a reference on its HBM blocks and pins its DRAM
    blocks, so neither is reused while the bytes move."""

    kind: str  # "swap_out" (HBM -> DRAM), "populate" / "prefetch" (DRAM -> HBM)
    seq: str | None
    hashes: list[int]
    hbm: list[int]
    dram: list[int]


class SwapMemo:
    """What the background swap-out's last scan of the LRU front learned, kept current as the
    pool changes, so that most plans need no scan (state -> decision stays a pure function:
    `tiers.plan_swap_out` decides from the memo exactly what a fresh scan would decide).

    A scan reads the first `EXTENT x` the decision's window (the window is the first
    `4 x swap_batch_blocks` LRU blocks) and marks those blocks with their positions, noting the
    positions of the unsaved ones (not yet in DRAM). Since then, the pool's moves report: a
    marked block leaving the LRU (`gone`, `removed`), a saved block put at the LRU's front
    (`cold`), and a marked block losing its DRAM copy (`unsave`: unsaved again; a cold one,
    everything forgotten). Blocks entering at the LRU's back land behind the marked ones. So the LRU still begins with the `cold` blocks, then the
    marked blocks not removed, in order; each one's position, and whether the window holds
    unsaved blocks and where the first is, follow without walking the LRU. Derived, never
    encoded: a decoded or copied state starts knowing nothing. (On the full Mooncake trace the
    scans took 14 % of the simulation's CPU, 86 us each: 256 steps of an OrderedDict's linked
    list, cache-cold; the LRU dicts are plain dicts since.)"""

    EXTENT = 4  # blocks read by a scan, in windows: a longer read lasts through more evictions

    __slots__ = ("marks", "now", "size", "blocks", "unsaved", "gone", "removed", "cold", "_asked",
                 "_answer")

    def __init__(self, blocks: int = 0) -> None:  # noqa: ARG002 - (the pool's size: not needed)
        # The marked blocks -> their position at the scan (-1: a saved block put at the front
        # since). A dict, built and dropped whole by C code (`remember`, `forget`): a scan's
        # 1,024 marks, written one by one into per-block lists, were most of its cost.
        self.marks: dict[int, int] = {}
        self.now = 1  # the scan's generation (`unsaved_within`'s memo)
        self.size = 0  # blocks marked at the scan
        self.blocks: list[int] = []  # the marked blocks, by position
        # Flags by position (bytes: counted and found by C code, `bytearray.count`/`find`):
        # unsaved and still on the LRU; left the LRU since the scan ("removed").
        self.unsaved = bytearray()
        self.gone = bytearray()
        self.removed = 0  # positions flagged in `gone`
        self.cold = 0  # saved blocks put at the LRU's front since the scan
        # The last `unsaved_within` question and its answer (see there)
        self._asked: tuple[int, int, int, int] = (0, 0, 0, 0)
        self._answer: tuple[int, tuple[int, ...]] = (0, ())

    def remember(self, marked: list[int], flags: bytes) -> None:
        """A scan read `marked` (the LRU's first blocks) and their saved flags (0 or 1)."""
        if len(marked) != len(flags):
            raise ValueError(f"{len(marked)} blocks, {len(flags)} flags")
        self.now += 1
        self.marks = dict(zip(marked, range(len(marked)), strict=True))
        self.size = len(marked)
        self.blocks = marked
        self.unsaved = bytearray(flags.translate(_NOT))
        self.gone = bytearray(len(marked))
        self.removed = self.cold = 0

    def forget(self) -> None:
        self.now += 1
        self.marks = {}
        self.size = self.cold = self.removed = 0
        self.blocks = []
        self.unsaved = bytearray()
        self.gone = bytearray()

    def unsave(self, b: int) -> None:
        """Marked block b lost its DRAM copy (evicted there): it is unsaved now, in its place on
        the LRU. (Forgetting everything instead cost a rescan for most DRAM evictions once DRAM
        is full: 3 of 4 scans on the Mooncake trace.)"""
        i = self.marks[b]
        if i < 0:  # one of the `cold` front blocks, all taken for saved
            self.forget()
            return
        self.unsaved[i] = 1
        self.now += 1  # not as `unsaved_within` expects: its kept answer is stale

    def known(self) -> int:
        """How many blocks at the LRU's front the memo knows."""
        return self.cold + self.size - self.removed

    def unsaved_within(self, window: int) -> tuple[int, tuple[int, ...]]:
        """The unsaved blocks among the LRU's first `window` (which the memo must know:
        `known() >= window`, or the whole LRU), in LRU order, and the LRU position of the
        first (0 when there is none).

        The answer is a function of `unsaved`, `gone` and `cold`, and between two scans or
        `unsave`s (`now`) a position leaves `unsaved` only as it joins `gone`, which only grows:
        (now, cold, removed, window) says whether anything changed since the last question,
        and most questions come again unchanged (a master asks after every batch; under
        pressure with too few unsaved blocks to copy, 2 of 3 full walks were for nothing).

        A marked block at scan position i is now at `cold + f(i)`, f(i) = i minus the gone
        positions below i, which never decreases with i: the window holds the marked
        positions below the least x with f(x) >= window - cold, x = k + (gone below x), found
        by counting flags in C (a bisection of a sorted list of positions per round compared
        Python ints: a third of this function's instructions)."""
        asked = (self.now, self.cold, self.removed, window)
        if asked == self._asked:
            return self._answer
        gone, unsaved = self.gone, self.unsaved
        k = window - self.cold  # marked blocks the window holds
        answer: tuple[int, tuple[int, ...]] = (0, ())
        first = unsaved.find(1)
        if k > 0 and first >= 0:
            # The least fixed point of x = k + (gone positions below x) is that x. The first
            # `head` positions are all gone (evictions take the LRU's front): start past them;
            # then each round counts only the positions the last one added.
            head = gone.find(0)
            if head < 0:
                head = len(gone)
            lo, x = head, k + head
            while d := gone.count(1, lo, x):
                lo, x = x, x + d
            if first < x:  # (first is not gone: past head)
                answer = (self.cold + first - head - gone.count(1, head, first),
                          tuple(compress(self.blocks[first:x], unsaved[first:x])))
        self._asked, self._answer = asked, answer
        return answer


class Rtc(msgspec.Struct, kw_only=True, dict=True):
    """The RTC master's whole state (one per DP group). Mutated only by `apply.apply`.
    (`dict=True`: room for the derived `swap_memo`, which is not a field and never encoded.)"""

    if TYPE_CHECKING:  # set by __post_init__, not a field
        swap_memo: SwapMemo = msgspec.field(default_factory=lambda: SwapMemo(0))

    config: RtcConfig
    ref: list[int]
    hbm_hash: list[int | None]  # chain hash held by each HBM block (None: no indexed content)
    free_hbm: list[int]
    # Plain dicts (insertion order is LRU order: entries are only appended and deleted). A
    # walk from the front skips the deleted entries left there until the dict next resizes (a
    # few instructions each), and every move costs half an OrderedDict's (no linked node).
    lru_hbm: dict[int, None]  # cached, unreferenced HBM blocks; LRU first (after cold_hbm)
    dram_hash: list[int | None]
    free_dram: list[int]
    lru_dram: dict[int, None]  # unpinned DRAM blocks holding KV; LRU first
    dram_pins: list[int]
    nodes: dict[int, Node]
    seqs: dict[str, SeqBlocks]
    caches: dict[str, NamedCache]
    copies: dict[str, CopyOp]
    finished: dict[str, bool]  # outcome of recent copies (QueryPopulate), bounded
    # hbm_saved[b] == 1 iff HBM block b holds indexed KV that DRAM holds too (derived from
    # hbm_hash + nodes, kept by `apply`): the background swap-out reads it for each LRU block
    # it looks at, one byte instead of two lookups.
    hbm_saved: bytearray = msgspec.field(default_factory=bytearray)
    next_copy: int = 0
    # Cached, unreferenced HBM blocks whose KV DRAM holds too, released by a swap-out: ahead of
    # `lru_hbm`, the latest first (`lru_order`).
    cold_hbm: dict[int, None] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        # A snapshot decoded from msgpack comes back with plain dicts: `finished` pops its front.
        if type(self.finished) is not OrderedDict:
            self.finished = OrderedDict(self.finished)
        if len(self.hbm_saved) != len(self.hbm_hash):  # a snapshot from before the field
            nodes = self.nodes
            self.hbm_saved = bytearray(
                h is not None and nodes[h].dram != NONE for h in self.hbm_hash
            )
        self.swap_memo = SwapMemo(len(self.ref))


    def __deepcopy__(self, memo: dict) -> Rtc:
        """The kernel deep-copies actor states at every snapshot; the generic deepcopy visits
        every int of the pool (~300 ms for a 60k-block pool). The lists hold immutable ints,
        so slicing copies them exactly; only the small mutable Structs are rebuilt."""
        return Rtc(
            config=self.config,
            ref=self.ref[:],
            hbm_hash=self.hbm_hash[:],
            free_hbm=self.free_hbm[:],
            lru_hbm=dict(self.lru_hbm),
            dram_hash=self.dram_hash[:],
            free_dram=self.free_dram[:],
            lru_dram=dict(self.lru_dram),
            dram_pins=self.dram_pins[:],
            nodes={h: Node(n.parent, n.hbm, n.dram) for h, n in self.nodes.items()},
            seqs={k: SeqBlocks(v.blocks[:], v.num_cached, v.loading) for k, v in self.seqs.items()},
            caches={k: NamedCache(v.hashes[:], v.blocks[:]) for k, v in self.caches.items()},
            copies={k: CopyOp(c.kind, c.seq, c.hashes[:], c.hbm[:], c.dram[:])
                    for k, c in self.copies.items()},
            finished=OrderedDict(self.finished),
            hbm_saved=bytearray(self.hbm_saved),
            next_copy=self.next_copy,
            cold_hbm=dict(self.cold_hbm),
        )


def new_rtc(config: RtcConfig) -> Rtc:
    """An empty RTC: every block free. Free stacks pop from the end, so block 0 is used first."""
    h, d = config.hbm_blocks, config.dram_blocks
    return Rtc(
        config=config,
        ref=[0] * h,
        hbm_hash=[None] * h,
        free_hbm=list(range(h - 1, -1, -1)),
        lru_hbm={},
        dram_hash=[None] * d,
        free_dram=list(range(d - 1, -1, -1)),
        lru_dram={},
        dram_pins=[0] * d,
        nodes={},
        seqs={},
        caches={},
        copies={},
        finished=OrderedDict(),
        hbm_saved=bytearray(h),
    )


def hbm_free_blocks(rtc: Rtc) -> int:
    """HBM blocks an allocation can take now (free + cached-unreferenced)."""
    return len(rtc.free_hbm) + len(rtc.lru_hbm) + len(rtc.cold_hbm)


def lru_order(rtc: Rtc) -> Iterator[int]:
    """The cached, unreferenced HBM blocks, the next to be evicted first."""
    cold = rtc.cold_hbm
    return chain(reversed(cold), rtc.lru_hbm) if cold else iter(rtc.lru_hbm)


def lru_blocks(rtc: Rtc) -> int:
    return len(rtc.lru_hbm) + len(rtc.cold_hbm)


def leave_lru(rtc: Rtc, b: int) -> None:
    """Take cached block b off the LRU (KeyError if it is not on it)."""
    cold = rtc.cold_hbm
    if cold and b in cold:
        del cold[b]
    else:
        del rtc.lru_hbm[b]


def hbm_used_blocks(rtc: Rtc) -> int:
    """HBM blocks held by someone (sequences, named caches, copies)."""
    return rtc.config.hbm_blocks - hbm_free_blocks(rtc)


def kv_usage(rtc: Rtc) -> float:
    """Fraction of HBM blocks in use (what the TE shell reports as KV usage)."""
    return hbm_used_blocks(rtc) / rtc.config.hbm_blocks


class RtcError(ValueError):
    """A call the RTC cannot honour (unknown sequence, over a limit, bad argument)."""
