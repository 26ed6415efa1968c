"""The background swap-out's plan (`tiers.plan_swap_out`: the swap-out memo, the event built by
maps) is its readable version's beside it in the source (`tiers.plan_swap_out_reference`: a walk
of the LRU's front, `copy_to_dram`), step by step through pools kept under pressure: prompts
cached and released (or released unindexed), hits on earlier ones, copies that finish, fail or stay in flight."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.rtc.tiers import plan_swap_out_reference

ops = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3), st.sampled_from(["ok", "fail", "keep"]),
                         st.booleans()),
               max_size=40)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(ops=ops, batch=st.integers(1, 4), min_blocks=st.integers(1, 3), dram=st.integers(2, 10))
def test_the_swap_out_plan_is_its_readable_versions(ops: list, batch: int, min_blocks: int, dram: int) -> None:
    r = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=16, dram_blocks=dram, block_tokens=4, swap_low_watermark=0.5,
                                  swap_batch_blocks=batch, swap_min_blocks=min_blocks, max_copies_in_flight=3))  # fmt: skip
    chains: list[list[int]] = []
    for i, (fresh, reuse, end, computed) in enumerate(ops):
        # a prompt: a prefix of an earlier one (a hit, if still cached) and `fresh` new blocks
        chain = (chains[reuse % len(chains)][:2] if chains and reuse else []) + [1000 * i + j for j in range(fresh)]
        chains.append(chain)
        m = rtc.match_by_prefix(r, chain)
        need = len(chain) - len(m.hbm_blocks)
        if rtc.can_allocate(r, need, m.hbm_blocks):
            seq = f"s{i}"
            rtc.apply(r, rtc.allocate(r, seq, need, shared=m.hbm_blocks))
            cached = rtc.cache_blocks(r, seq, chain) if computed else None  # else: back to free
            if cached is not None:
                rtc.apply(r, cached)
            rtc.apply(r, rtc.free(r, seq))  # its blocks join the LRU
        plan = rtc.plan_swap_out(r)
        assert plan == plan_swap_out_reference(r)
        event("a copy planned" if plan else "nothing to copy")
        if plan is not None:
            rtc.apply(r, plan)
            if end != "keep":
                rtc.apply(r, rtc.finish_copy(r, plan.copy_id, end == "ok"))
