"""Whether a DP master accepts a task: the checks of a `SubmitTask` against the group's
config and state, each refusal naming the field (split from actor.py by concept)."""

from __future__ import annotations

from deepserve.actors.flowserve.master.state import MasterConfig, MasterState
from deepserve.actors.flowserve.messages import MAX_OUTPUT_TOKENS, SubmitTask
from deepserve.actors.flowserve.tokens import blocks_needed


def admission_problem(st: MasterState, cfg: MasterConfig, msg: SubmitTask) -> str | None:
    """Why the task cannot be accepted (naming the field), or None."""
    p, B = msg.prompt, cfg.block_tokens
    if st.device_lost:
        return f"device lost: {st.device_lost}"
    if msg.model != cfg.model:
        return f"model: this TE serves {cfg.model!r}, not {msg.model!r}"
    if msg.task_id in st.reqs or msg.task_id in st.rtc.seqs:
        return f"task_id: {msg.task_id!r} is already running here"
    if p.num_tokens < 1:
        return f"prompt.num_tokens: must be >= 1, got {p.num_tokens}"
    if len(p.block_hashes) != p.num_tokens // B:
        return (f"prompt.block_hashes: {p.num_tokens} tokens of {B}-token blocks need "
                f"{p.num_tokens // B} hashes, got {len(p.block_hashes)}")  # fmt: skip
    if not 1 <= msg.sampling.max_tokens <= MAX_OUTPUT_TOKENS:
        return f"sampling.max_tokens: must be in [1, {MAX_OUTPUT_TOKENS}]"
    if not cfg.chunked_prefill and msg.kind != "decode" and p.num_tokens > cfg.max_num_batched_tokens:
        # One pass must take the whole prompt: it would wait at the queue's head forever,
        # and every task behind it (FCFS) with it.
        return (f"prompt.num_tokens: {p.num_tokens} tokens exceed the token budget of one pass "
                f"(max_num_batched_tokens={cfg.max_num_batched_tokens}) and chunked prefill is off")  # fmt: skip
    if blocks_needed(p.num_tokens + 1, B) > cfg.hbm_blocks:
        return (f"prompt.num_tokens: {p.num_tokens} tokens need more KV blocks than the DP "
                f"group has ({cfg.hbm_blocks} of {B} tokens)")  # fmt: skip
    if msg.kind == "decode" and msg.kv_source is None:
        return "kv_source: a decode task needs the prefill side's KV handle"
    if msg.resume_from and not 0 < msg.resume_from < msg.sampling.max_tokens:
        return f"resume_from: a resumed task starts inside [1, max_tokens), got {msg.resume_from}"
    if len(st.reqs) >= cfg.max_waiting:
        return f"queue full: {len(st.reqs)} tasks (max_waiting={cfg.max_waiting})"
    return None
