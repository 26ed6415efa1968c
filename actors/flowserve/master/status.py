"""What a DP group reports about itself (TE shell load reports, the DP balancer). Pure."""

from __future__ import annotations

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import MasterConfig, MasterState
from deepserve.actors.flowserve.messages import DpLoad
from deepserve.actors.flowserve.tokens import blocks_needed


def reserved_blocks(st: MasterState, cfg: MasterConfig) -> int:
    """Blocks running tasks will still need for their outputs, as a real engine knows them
    (max_tokens, or the trace's target length when replaying one)."""
    B = cfg.block_tokens
    total = 0
    for tid in st.running:
        r = st.reqs[tid]
        s = r.task.sampling
        cap = s.max_tokens if s.target_output_tokens is None else min(s.max_tokens, s.target_output_tokens)
        need = blocks_needed(r.task.prompt.num_tokens + cap, B) - len(rtc.block_table(st.rtc, tid))
        total += max(0, need)
    return total


def dp_load(st: MasterState, cfg: MasterConfig) -> DpLoad:
    return DpLoad(
        dp=cfg.dp, waiting=len(st.reqs) - len(st.running), running=len(st.running),
        kv_blocks_used=rtc.hbm_used_blocks(st.rtc), kv_blocks_total=cfg.hbm_blocks,
        kv_blocks_reserved=reserved_blocks(st, cfg), prompt_tokens=st.prompt_tokens,
        cached_prompt_tokens=st.cached_prompt_tokens,
        prefill_tokens_waiting=sum(
            max(0, r.task.prompt.num_tokens - r.num_computed) for r in st.reqs.values()
        ),
        max_num_seqs=cfg.max_num_seqs, device_lost=st.device_lost,
    )  # fmt: skip
