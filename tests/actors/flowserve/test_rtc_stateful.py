"""Hypothesis state machine: the RTC against the naive reference model (rtc_reference.py).

After every step: no leak (every HBM/DRAM block is held, free or cached — exactly one), no
double free (apply refuses it; ref counts never negative), HBM use never above capacity, the
block ids every decision picks equal the reference's, matches equal the reference's, and the
mirror folded from the KV events equals the RTC's index. And every event folded by `apply` (the
fast path) leaves the state its readable version `apply_reference` leaves (both in rtc/apply.py),
the swap-out memo (not a field) included.
"""

from __future__ import annotations

import copy
import os
import sys
from collections import Counter

import msgspec
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.rtc.apply import apply_reference
from deepserve.actors.flowserve.rtc.state import NONE, SwapMemo
from deepserve.actors.flowserve.rtc.tiers import _scan, plan_swap_out_reference
from deepserve.core.codec import encode

sys.path.insert(0, os.path.dirname(__file__))
from rtc_reference import RefPool  # noqa: E402

HBM_BLOCKS, DRAM_BLOCKS, BLOCK = 10, 6, 4
MASK = (1 << 64) - 1


def chain_of(tokens: list[int], salt: int = 0) -> list[int]:
    """Chain hashes of a prompt whose i-th block content is tokens[i] (a tiny vocabulary makes
    shared prefixes frequent)."""
    out, h = [], salt
    for t in tokens:
        h = (h * 0x100000001B3 + t + 1) & MASK
        out.append(h)
    return out


def _memo(m: SwapMemo) -> tuple:
    return tuple(getattr(m, name) for name in SwapMemo.__slots__)


prompts = st.lists(st.integers(0, 1), min_size=1, max_size=5)


class RtcMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.r = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=HBM_BLOCKS, dram_blocks=DRAM_BLOCKS,
                                           block_tokens=BLOCK, swap_low_watermark=0.25,
                                           swap_batch_blocks=3))
        self.ref = RefPool(HBM_BLOCKS, DRAM_BLOCKS)
        self.mirror = rtc.Mirror()
        self.chains: dict[str, list[int]] = {}
        self.n = 0
        self.log: list[bytes] = []  # every event, encoded as the log stores it

    def rec(self, ev: object) -> None:
        self.log.append(encode(ev))
        twin = copy.deepcopy(self.r)
        twin.swap_memo = copy.deepcopy(self.r.swap_memo)  # (a deepcopy of the state drops it)
        apply_reference(twin, ev)
        rtc.apply(self.r, ev)
        assert twin == self.r, ev
        assert _memo(twin.swap_memo) == _memo(self.r.swap_memo), ev
        event(f"fast and reference: {type(ev).__name__} {getattr(ev, 'kind', '')}")
        for k in rtc.kv_events_of(ev, BLOCK):
            self.mirror.fold(k)

    # ---- rules ----
    @rule(tokens=prompts, extra=st.integers(0, 2), want_populate=st.booleans(), computed=st.booleans())
    def admit(self, tokens: list[int], extra: int, want_populate: bool, computed: bool) -> None:
        self.n += 1
        chain = chain_of(tokens) + chain_of([9] * extra, salt=self.n)  # decode blocks: unique
        self._admit(self._seq_id(), chain, want_populate, computed)

    @rule(data=st.data(), computed=st.booleans())
    def admit_swapped(self, data: st.DataObject, computed: bool) -> None:
        """A prompt whose prefix is (partly) in DRAM only: the populate path."""
        tips = sorted(h for h, n in self.r.nodes.items() if n.dram != NONE)
        if not tips:
            return
        h: int | None = data.draw(st.sampled_from(tips))
        chain: list[int] = []
        while h is not None and h in self.r.nodes:
            chain.append(h)
            h = self.r.nodes[h].parent
        if h is not None:
            return  # an ancestor was evicted from both tiers: not a reachable prefix
        self.n += 1
        self._admit(self._seq_id(), chain[::-1], True, computed)

    def _seq_id(self) -> str:
        """Ids come back after their sequence is freed (a copy in flight must not mind)."""
        return next(f"s{i}" for i in range(10_000) if f"s{i}" not in self.chains)

    def _admit(self, seq: str, chain: list[int], want_populate: bool, computed: bool) -> None:
        m = rtc.match_by_prefix(self.r, chain)
        hbm_ref, dram_ref = self.ref.match(chain)
        assert (list(m.hbm_blocks), list(m.dram_blocks)) == (hbm_ref, dram_ref)
        if want_populate and m.dram_blocks and rtc.can_allocate(self.r, len(m.dram_blocks), m.hbm_blocks):
            ev = rtc.populate(self.r, seq, chain, m)
            assert ev is not None and ev.kind == rtc.POPULATE
            picked = self.ref.populate(ev.copy_id, seq, chain)
            assert list(ev.hbm) == picked
            event("populate")
            self.rec(ev)
            self.chains[seq] = chain
            return
        need = len(chain) - len(m.hbm_blocks)
        ok = rtc.can_allocate(self.r, need, m.hbm_blocks)
        assert ok == (self.ref.available() - sum(1 for b in m.hbm_blocks if self.ref.ref[b] == 0) >= need)
        if ok:
            ev = rtc.allocate(self.r, seq, need, shared=m.hbm_blocks)
            picked, evicted = self.ref.allocate(seq, need, m.hbm_blocks)
            assert (list(ev.blocks), list(ev.evicted)) == (picked, evicted)
            event("admit: evicted" if ev.evicted else ("admit: hit" if ev.shared else "admit"))
            self.rec(ev)
            self.chains[seq] = chain
            if computed:  # the prefill ran: index the prompt's blocks (as the DP master does)
                cached = rtc.cache_blocks(self.r, seq, chain)
                assert (list(cached.hashes) if cached else []) == self.ref.cache(seq, chain)
                if cached:
                    self.rec(cached)

    def _ready(self) -> list[str]:
        return sorted(s for s in self.chains if not rtc.is_loading(self.r, s))

    @precondition(lambda self: self.chains)
    @rule(data=st.data(), upto=st.integers(0, 8))
    def cache(self, data: st.DataObject, upto: int) -> None:
        ready = self._ready()
        if not ready:
            return
        seq = data.draw(st.sampled_from(ready))
        chain = self.chains[seq][:upto]
        ev = rtc.cache_blocks(self.r, seq, chain)
        stored = self.ref.cache(seq, chain)
        if ev is not None:
            assert list(ev.hashes) == stored
            self.rec(ev)
        else:
            assert stored == []

    @precondition(lambda self: self.chains)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        ready = self._ready()
        if not ready or not rtc.can_allocate(self.r, 1):
            return
        seq = data.draw(st.sampled_from(ready))
        ev = rtc.append_block(self.r, seq)
        picked, evicted = self.ref.allocate(seq, 1, ())
        assert (list(ev.blocks), list(ev.evicted)) == (picked, evicted)
        self.rec(ev)
        self.chains[seq].append(chain_of([7], salt=hash((seq, len(self.chains[seq]))))[0])

    @precondition(lambda self: self.chains)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.release_seq(data.draw(st.sampled_from(sorted(self.chains))))

    @rule(tokens=prompts, ok=st.booleans())
    def cycle_through_dram(self, tokens: list[int], ok: bool) -> None:
        """Prefill a prompt, finish it, Copy it to DRAM, then flood HBM: its prefix is left in
        DRAM only (the state that populate and prefetch need)."""
        self.n += 1
        seq, chain = f"s{self.n}", chain_of(tokens)
        self._admit(seq, chain, False, True)
        if seq not in self.chains or rtc.is_loading(self.r, seq):
            return
        self.release_seq(seq)
        if len(self.r.copies) < self.r.config.max_copies_in_flight:
            ev = rtc.copy_to_dram(self.r, chain)
            assert (list(ev.hashes) if ev else []) == self.ref.swap_out(f"c{self.r.next_copy}", chain)
            if ev is not None:
                self.rec(ev)
                self.rec(rtc.finish_copy(self.r, ev.copy_id, ok))
                self.ref.finish(ev.copy_id, ok)
        self.flood(HBM_BLOCKS)

    def release_seq(self, seq: str) -> None:
        self.rec(rtc.free(self.r, seq))
        self.ref.release(seq)
        del self.chains[seq]

    @rule(n=st.integers(1, HBM_BLOCKS))
    def flood(self, n: int) -> None:
        """A burst of fresh blocks that is released at once: evicts cached HBM copies."""
        n = min(n, rtc.hbm_free_blocks(self.r))
        if n == 0:
            return
        self.n += 1
        seq = f"f{self.n}"
        ev = rtc.allocate(self.r, seq, n)
        assert (list(ev.blocks), list(ev.evicted)) == self.ref.allocate(seq, n, ())
        self.rec(ev)
        self.rec(rtc.free(self.r, seq))
        self.ref.release(seq)

    @rule(data=st.data(), tokens=prompts)
    def copy_out(self, data: st.DataObject, tokens: list[int]) -> None:
        """Table-1 Copy of some indexed HBM blocks (or of a random prompt's, mostly absent)."""
        in_hbm = sorted(h for h, n in self.r.nodes.items() if n.hbm != NONE)
        chain = data.draw(st.lists(st.sampled_from(in_hbm), max_size=4)) if in_hbm else []
        chain += chain_of(tokens)
        if len(self.r.copies) >= self.r.config.max_copies_in_flight:
            return
        ev = rtc.copy_to_dram(self.r, chain)
        cid = f"c{self.r.next_copy}"
        todo = self.ref.swap_out(cid, chain)
        assert (list(ev.hashes) if ev else []) == todo
        if ev:
            self.rec(ev)

    @rule()
    def swap_out_under_pressure(self) -> None:
        r, size = self.r, 4 * self.r.config.swap_batch_blocks
        known = r.swap_memo.size > 0 and r.swap_memo.known() >= min(size, rtc.lru_blocks(r))
        ev = rtc.plan_swap_out(r)
        # The readable version beside it (tiers.plan_swap_out_reference: an LRU walk) agrees
        assert ev == plan_swap_out_reference(r)
        # The memo that spares most scans (state.SwapMemo) decides as a fresh scan would: a
        # copy of the state starts with no memo.
        assert ev == rtc.plan_swap_out(copy.deepcopy(r))
        # Asked again with nothing changed, the memo answers from its kept answer, the same
        assert ev == rtc.plan_swap_out(r)
        if known:
            event(f"swap-out decided from the memo ({'a copy' if ev else 'nothing'})")
        if ev is not None:
            # built from the memo's blocks without copy_to_dram's checks (tiers._swap_out): the same
            assert ev == rtc.copy_to_dram(r, list(ev.hashes))
            assert self.ref.swap_out(ev.copy_id, list(ev.hashes)) == list(ev.hashes)
            event("background swap-out")
            self.rec(ev)

    @rule(tokens=prompts)
    def prefetch(self, tokens: list[int]) -> None:
        chain = chain_of(tokens)
        ev = rtc.prefetch(self.r, chain)
        if ev is not None:
            assert list(ev.hbm) == self.ref.populate(ev.copy_id, None, chain)
            event("prefetch")
            self.rec(ev)

    @precondition(lambda self: self.r.copies)
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data: st.DataObject, ok: bool) -> None:
        cid = data.draw(st.sampled_from(sorted(self.r.copies)))
        fin = rtc.finish_copy(self.r, cid, ok)
        event(f"finish {self.r.copies[cid].kind} ok={ok} stored={bool(fin.stored)}")
        self.rec(fin)
        self.ref.finish(cid, ok)

    @precondition(lambda self: self.chains)
    @rule(data=st.data())
    def name_cache(self, data: st.DataObject) -> None:
        ready = self._ready()
        cid = f"ctx{self.n}"
        if not ready or cid in self.r.caches:
            return
        seq = data.draw(st.sampled_from(ready))
        self.rec(rtc.create_cache(self.r, cid, seq, self.chains[seq]))
        self.ref.create_cache(cid, seq, self.chains[seq])
        hashes, m = rtc.match_by_id(self.r, cid)
        assert list(m.hbm_blocks) == self.ref.caches[cid]

    @precondition(lambda self: self.r.caches)
    @rule(data=st.data())
    def drop_cache(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.r.caches)))
        self.rec(rtc.delete_cache(self.r, cid))
        self.ref.delete_cache(cid)

    @rule(tokens=prompts)
    def probe(self, tokens: list[int]) -> None:
        chain = chain_of(tokens)
        m = rtc.match_by_prefix(self.r, chain)
        assert (list(m.hbm_blocks), list(m.dram_blocks)) == self.ref.match(chain)
        assert self.mirror.match(chain) >= m.num_blocks
        assert self.mirror.match_tiers(chain) == (len(m.hbm_blocks), len(m.dram_blocks))
        event("probe: hbm+dram" if m.hbm_blocks and m.dram_blocks else "probe")

    def _chain_to(self, h: int | None) -> list[int] | None:
        """The chain from the root to node h, or None when an ancestor is gone."""
        chain: list[int] = []
        while h is not None and h in self.r.nodes:
            chain.append(h)
            h = self.r.nodes[h].parent
        return chain[::-1] if h is None else None

    @rule(data=st.data(), others=st.lists(prompts, max_size=2))
    def background_prefetch(self, data: st.DataObject, others: list[list[int]]) -> None:
        tips = sorted(h for h, n in self.r.nodes.items() if n.dram != NONE)
        queued = [chain_of(t) for t in others]
        if tips:
            c = self._chain_to(data.draw(st.sampled_from(tips)))
            if c is not None:
                queued.insert(data.draw(st.integers(0, len(queued))), c)
        ev = rtc.plan_prefetch(self.r, queued)
        picked = self.ref.plan_prefetch(f"c{self.r.next_copy}", queued, self.r.config.prefetch_min_free)
        assert (list(ev.hbm) if ev else None) == picked
        if ev is not None:
            assert ev.evicted_hbm == () and ev.kind == rtc.PREFETCH
            event("background prefetch")
            self.rec(ev)

    @rule(data=st.data())
    def probe_swapped(self, data: st.DataObject) -> None:
        tips = sorted(self.r.nodes)
        if tips:
            chain: list[int] = []
            h: int | None = data.draw(st.sampled_from(tips))
            while h is not None and h in self.r.nodes:
                chain.append(h)
                h = self.r.nodes[h].parent
            m = rtc.match_by_prefix(self.r, chain[::-1])
            assert (list(m.hbm_blocks), list(m.dram_blocks)) == self.ref.match(chain[::-1])
            assert self.mirror.match_tiers(chain[::-1]) == (len(m.hbm_blocks), len(m.dram_blocks))

    @rule()
    def memo_reads_the_lru(self) -> None:
        """The swap-out memo scans the LRU now (as a plan under pressure would), so that the
        moves after it find blocks marked: a DRAM eviction of one (`SwapMemo.unsave`), say."""
        _scan(self.r, self.r.swap_memo, 4 * self.r.config.swap_batch_blocks)

    # ---- invariants ----
    @invariant()
    def memo_answers_as_a_fresh_scan(self) -> None:
        r, memo = self.r, self.r.swap_memo
        if memo.size or memo.cold:
            fresh = SwapMemo()
            _scan(r, fresh, 4 * r.config.swap_batch_blocks)
            window = min(memo.known(), rtc.lru_blocks(r))
            assert memo.unsaved_within(window) == fresh.unsaved_within(window)

    @invariant()
    def no_leak_no_negative_refs(self) -> None:
        r = self.r
        holders: Counter[int] = Counter()
        for sb in r.seqs.values():
            holders.update(sb.blocks)
        for c in r.caches.values():
            holders.update(c.blocks)
        for c in r.copies.values():
            holders.update(c.hbm)
        for b in range(HBM_BLOCKS):
            assert r.ref[b] >= 0
            assert r.ref[b] == holders[b], (b, r.ref[b], holders[b])
            in_free, in_lru = b in r.free_hbm, b in r.lru_hbm or b in r.cold_hbm
            assert not (b in r.lru_hbm and b in r.cold_hbm)
            if r.ref[b] == 0:
                assert in_free != in_lru  # exactly one place: no leak
                assert in_free == (r.hbm_hash[b] is None)
            else:
                assert not in_free and not in_lru
        assert len(set(r.free_hbm)) == len(r.free_hbm)
        assert rtc.hbm_used_blocks(r) == sum(1 for x in r.ref if x) <= HBM_BLOCKS
        pins: Counter[int] = Counter()
        for c in r.copies.values():
            pins.update(c.dram)
        for d in range(DRAM_BLOCKS):
            assert r.dram_pins[d] == pins[d]
            if pins[d] == 0:
                assert (d in r.free_dram) != (d in r.lru_dram)
                assert (d in r.free_dram) == (r.dram_hash[d] is None)
        assert r.ref == self.ref.ref and r.dram_pins == self.ref.pins

    @invariant()
    def index_is_consistent_and_mirrored(self) -> None:
        r = self.r
        for h, node in r.nodes.items():
            assert node.hbm != NONE or node.dram != NONE
            if node.hbm != NONE:
                assert r.hbm_hash[node.hbm] == h
            if node.dram != NONE:
                assert r.dram_hash[node.dram] == h
        for b, h in enumerate(r.hbm_hash):  # the swap-out's derived index
            assert r.hbm_saved[b] == (h is not None and r.nodes[h].dram != NONE), b
        view = rtc.index_view(r)
        assert view == self.mirror.view()
        ref_view = {h: (p, h in self.ref.where_hbm, h in self.ref.where_dram)
                    for h, p in self.ref.parent.items()}
        assert view == ref_view


    def teardown(self) -> None:
        """Replay: folding the encoded events into a fresh RTC rebuilds the same state, and a
        snapshot (deepcopy) of it is equal too."""
        replayed = rtc.new_rtc(self.r.config)
        for blob in self.log:
            raw = msgspec.msgpack.decode(blob)
            rtc.apply(replayed, msgspec.msgpack.decode(blob, type=rtc.RtcEvent))
            assert raw  # a tagged map, not an empty payload
        assert replayed == self.r == copy.deepcopy(self.r)


RtcMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("RTC_EXAMPLES", "60")), stateful_step_count=50,
    deadline=None, suppress_health_check=[HealthCheck.too_slow],
)
test_rtc_state_machine = RtcMachine.TestCase
