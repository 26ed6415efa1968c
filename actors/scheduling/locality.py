"""`locality`: the global prompt tree of a TE group and longest-common-prefix selection
(DeepServe §5.2, Algorithm 1's select_tes_prefix_match).

The tree is keyed by the prompts' 64-bit chain hashes (a block's hash names its whole prefix, so
a dict from hash to holders *is* a prefix tree: the parent is implied by the chain). Each node
records which TEs hold the block and where, as a bitmask:

- `HBM` / `DRAM`: folded from a TE's KV cache events (vLLM's BlockStored / BlockRemoved /
  AllBlocksCleared, `actors/flowserve/rtc/kv_events.py`) — the TE's local tree, mirrored;
- `ROUTED`: inserted by the JE when it routes a prompt to a TE (what SGLang's router does): the
  TE will have computed those blocks unless it evicts them. Only a fallback for a TE that
  publishes no KV events: the JE drops a TE's ROUTED bits when its first events arrive
  (`drop_routed`); a BlockRemoved for the block clears it too.

A TE with several DP groups publishes one stream per group (`KVEventBatch.data_parallel_rank`):
each rank has its own HBM/DRAM bits (rank r: the rank-0 bits shifted by 3r), so one group
evicting a block does not hide another group's copy.

A bound (`max_blocks`) evicts the oldest-inserted blocks first: the tree never grows unbounded.
Pure data (a msgspec Struct), so it lives in the JE's event-sourced state; its keys are the hashes
in decimal text because the kernel encodes state with sorted keys, which msgpack allows for str only.
"""

from __future__ import annotations

import copy
from operator import attrgetter

import msgspec

from .decision import Candidate, Decision, Excluded, RouteRequest, need_candidates, ranked
from .least_load import BY_LOAD

HBM, DRAM, ROUTED = 1, 2, 4
MEDIUM_BITS = {"HBM": HBM, "DRAM": DRAM, "GPU": HBM, "CPU": DRAM, None: HBM}
MAX_BLOCKS_DEFAULT = 1 << 20
RANK_SLOTS = 21  # DP ranks with their own bits (3 bits each fit 64); higher ranks share a slot
RANK0_MEDIA = HBM | DRAM


def rank_shift(rank: int | None) -> int:
    return 3 * (rank % RANK_SLOTS) if rank else 0


class PromptTree(msgspec.Struct, kw_only=True):
    nodes: dict[str, dict[str, int]] = {}  # str(chain hash) -> {te: medium bits}
    max_blocks: int = MAX_BLOCKS_DEFAULT

    def __deepcopy__(self, memo: dict[int, object]) -> PromptTree:
        """`copy.deepcopy`, without its walk: the kernel deep-copies the JE's state at every
        snapshot, and the tree is most of it (34k nodes on the Mooncake trace: 58 ms by
        `deepcopy`'s generic walk, 17 ms with a copy of each holders dict, ~1 ms now). The same
        tree as `deepcopy_reference`, sharing the holders dicts: they are never changed once in
        the tree (`insert`, `remove` and `_strip` put a changed copy in the node's place), so
        neither tree can change the other's (tests/actors/scheduling/test_tree_copy.py)."""
        return PromptTree(nodes=dict(self.nodes), max_blocks=self.max_blocks)

    def deepcopy_reference(self) -> PromptTree:
        """`__deepcopy__`, readable: the generic walk (tests/actors/scheduling/test_tree_copy.py)."""
        return msgspec.structs.replace(self, nodes=copy.deepcopy(self.nodes))

    def insert(self, te: str, hashes: tuple[int, ...] | list[int], bits: int = ROUTED) -> None:
        nodes = self.nodes
        for hh in hashes:
            h = str(hh)
            holders = nodes.get(h)
            if holders is None:
                nodes[h] = {te: bits}
                continue
            have = holders.get(te)
            now = bits if have is None else have | bits
            if now != have:  # a changed copy in its place (`__deepcopy__` shares holders)
                holders = holders.copy()
                holders[te] = now
                nodes[h] = holders
        while len(nodes) > self.max_blocks:
            del nodes[next(iter(nodes))]

    def remove(self, te: str, hashes: tuple[int, ...] | list[int], bits: int) -> None:
        """A TE dropped blocks from a medium: the ROUTED belief goes too (it was about them)."""
        nodes = self.nodes
        for hh in hashes:
            h = str(hh)
            holders = nodes.get(h)
            if holders is None or te not in holders:
                continue
            left = holders[te] & ~(bits | ROUTED)
            if left:
                if left != holders[te]:  # a changed copy in its place (`__deepcopy__` shares holders)
                    holders = holders.copy()
                    holders[te] = left
                    nodes[h] = holders
            elif len(holders) == 1:
                del nodes[h]
            else:
                holders = holders.copy()
                del holders[te]
                nodes[h] = holders

    def clear(self, te: str, rank: int | None = None) -> None:
        """One DP rank of `te` dropped everything (AllBlocksCleared)."""
        media = RANK0_MEDIA << rank_shift(rank)
        for h in [int(h) for h, holders in self.nodes.items() if te in holders]:
            self.remove(te, (h,), media)

    def forget(self, te: str) -> None:
        """`te` left its group: drop every belief about it (a TE coming back starts empty)."""
        self._strip(te, ~0)

    def drop_routed(self, te: str) -> None:
        """`te` publishes KV events now: its ROUTED guesses give way to what it reports."""
        self._strip(te, ROUTED)

    def _strip(self, te: str, bits: int) -> None:
        nodes = self.nodes
        for h in [h for h, holders in nodes.items() if te in holders]:
            holders = nodes[h]
            left = holders[te] & ~bits
            if left:
                if left != holders[te]:  # a changed copy in its place (`__deepcopy__` shares holders)
                    holders = holders.copy()
                    holders[te] = left
                    nodes[h] = holders
            elif len(holders) == 1:
                del nodes[h]
            else:
                holders = holders.copy()
                del holders[te]
                nodes[h] = holders

    def fold_kv_events(self, te: str, events: tuple[object, ...] | list[object], rank: int | None) -> None:
        """Apply a batch of `te`'s DP rank `rank` in order (the hot path of the JE's folding)."""
        shift = rank_shift(rank)
        for ev in events:
            kind = type(ev).__name__
            if kind == "BlockStored":
                self.insert(te, ev.block_hashes, MEDIUM_BITS.get(ev.medium, HBM) << shift)  # type: ignore[attr-defined]
            elif kind == "BlockRemoved":
                self.remove(te, ev.block_hashes, MEDIUM_BITS.get(ev.medium, HBM) << shift)  # type: ignore[attr-defined]
            else:
                self.fold_kv_event(te, ev, rank)

    def fold_kv_event(self, te: str, event: object, rank: int | None = None) -> None:
        """Apply one vLLM-shape KV cache event published by DP rank `rank` of `te` (duck-typed
        by class name so this module needs no import of the TE's package)."""
        kind = type(event).__name__
        if kind == "BlockStored":
            bits = MEDIUM_BITS.get(event.medium, HBM) << rank_shift(rank)  # type: ignore[attr-defined]
            self.insert(te, event.block_hashes, bits)  # type: ignore[attr-defined]
        elif kind == "BlockRemoved":
            bits = MEDIUM_BITS.get(event.medium, HBM) << rank_shift(rank)  # type: ignore[attr-defined]
            self.remove(te, event.block_hashes, bits)  # type: ignore[attr-defined]
        elif kind == "AllBlocksCleared":
            self.clear(te, rank)
        else:
            raise TypeError(f"not a KV cache event: {kind}")

    def match(self, hashes: tuple[int, ...] | list[int], tes: list[str]) -> dict[str, int]:
        """Leading blocks of `hashes` each TE of `tes` holds (one walk down the prompt)."""
        return self.walk(hashes, tes)[0]

    def walk(self, hashes: tuple[int, ...] | list[int], tes: list[str]) -> tuple[dict[str, int], int]:
        """(`match`, the longest of its values): the JE's one walk per decision, which hands the
        predictor the longest match it already knows (the depth where the walk stopped) instead
        of a max over every TE.

        The fast path of `match_reference` (tests/actors/scheduling/test_tree_walk.py: they
        agree): the TEs still matching are a set, and a block every one of them holds (a shared
        system prompt: the usual case) costs one C-level subset test instead of a Python loop."""
        if not tes:
            return {}, 0
        out = dict.fromkeys(tes, 0)
        alive = set(tes)
        nodes = self.nodes
        depth = 0
        for h in hashes:
            holders = nodes.get(str(h))
            if holders is None:
                break
            held = holders.keys()
            if not alive <= held:
                left = alive & held
                for te in alive - left:
                    out[te] = depth
                alive = left
                if not alive:
                    break
            depth += 1
        for te in alive:
            out[te] = depth
        return out, depth  # the last TEs matching stopped at `depth`: the longest match

    def match_reference(self, hashes: tuple[int, ...] | list[int], tes: list[str]) -> dict[str, int]:
        """`match`, as readable as it can be: per block, which of the still-matching TEs hold it."""
        out = dict.fromkeys(tes, 0)
        alive = list(tes)
        for i, h in enumerate(hashes):
            holders = self.nodes.get(str(h))
            if holders is None:
                break
            keep = [te for te in alive if te in holders]
            for te in alive:
                out[te] = i + 1 if te in holders else out[te]
            alive = keep
            if not alive:
                break
        return out


def by_prefix(cands: tuple[Candidate, ...] | list[Candidate]) -> list[Candidate]:
    """Longest prefix first; among equals the least loaded, then name (deterministic). Two
    stable sorts on C-level keys: the order of the key (-prefix_blocks, load, te)."""
    return sorted(sorted(cands, key=BY_LOAD), key=PREFIX, reverse=True)  # reverse keeps ties' order


PREFIX = attrgetter("prefix_blocks")


PREFIX_ORDER = ("-prefix_blocks", "load")  # Decision.order_by of by_prefix


class LocalityParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # A TE with more than this many open tasks above the least-loaded candidate is not preferred
    # for its cache: without a bound every request sharing a first block (a system prompt) herds
    # onto the one TE that holds it (Mooncake: a 1-hour trace took 5.9 virtual hours).
    load_bound: int = 4

    def __post_init__(self) -> None:
        if self.load_bound < 0:
            raise ValueError(f"scheduling.params.load_bound: must be >= 0, got {self.load_bound}")


def within_bound(cands: tuple[Candidate, ...], bound: int) -> tuple[list[Candidate], list[Excluded]]:
    """(the candidates within `bound` open tasks of the least loaded, the others with why)."""
    floor = min(c.load for c in cands)
    keep = [c for c in cands if c.load <= floor + bound]
    over = [Excluded(tes=(c.te,), subgroup=c.subgroup,
                     reason=f"over the load bound: {c.load} open > least {floor} + load_bound {bound}")
            for c in cands if c.load > floor + bound]  # fmt: skip
    return keep, over


def select_locality(req: RouteRequest, cands: tuple[Candidate, ...],
                    p: LocalityParams = LocalityParams()) -> Decision:  # noqa: B008 (frozen)
    need_candidates(cands, "locality")
    keep, over = within_bound(cands, p.load_bound)
    order = by_prefix(keep)
    best = order[0]
    why = (f"longest common prefix: {best.prefix_blocks} of {req.prompt_blocks} blocks"
           if best.prefix_blocks else "no TE holds a prefix: least loaded")
    if over:
        why += f" among the {len(keep)} TEs within load_bound {p.load_bound} of the least loaded"
    return Decision(policy="locality", params={"load_bound": float(p.load_bound)}, chosen=best.te,
                    subgroup=best.subgroup, ranked=ranked(order), reason=why, order_by=PREFIX_ORDER,
                    excluded=tuple(over))
