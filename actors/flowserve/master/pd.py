"""PD disaggregation inside the DP master (xDeepServe §5.1).

Prefill side: when a prefill task has produced its first token, the master registers a PD
transfer — metadata only (`KvHandle`: block addresses and fingerprints) — keeps the blocks, and
finishes the task with the handle. It frees them when DistFlow reports the decode side has them
(`KvRelease`), or when the hold times out.

Decode side: a decode task arrives with the handle; the master checks its KV capacity and defers
the receive when short (backpressure: the task waits in `deferred`, never an OOM); otherwise it
allocates the blocks and asks the DistFlow channel of this P–D pair to pull the KV. The channel's
completion (`KvRecvDone`) carries per-block verification: success enqueues the task for decode,
failure (a link, a dead peer, a timeout, a corrupted block) fails exactly that task with the
reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.output import finished_message
from deepserve.actors.flowserve.master.state import (
    DEFERRED,
    RECEIVING,
    WAITING,
    Req,
    TaskEnded,
    TaskQueued,
    TaskStatus,
    TransferHeld,
    TransferReleased,
)
from deepserve.actors.flowserve.messages import KvHandle, SubmitTask
from deepserve.actors.flowserve.tokens import (
    blocks_needed,
    emulated_token,
    eos_token_id,
    kv_fingerprints,
)
from deepserve.core import Context, Message

if TYPE_CHECKING:
    from deepserve.actors.flowserve.master.actor import DpMaster

__all__ = ["RECEIVING", "handles", "handle", "hold", "submit_decode"]


def hold(m: DpMaster, ctx: Context, r: Req) -> None:
    """Prefill done: register the transfer (metadata only), keep the blocks, finish the task."""
    cfg, st = m.cfg, m.state
    p, tid = r.task.prompt, r.task.task_id
    table = rtc.block_table(st.rtc, tid)
    first = eos_token_id(cfg.vocab) if r.stop == "stop" and r.out_len == 1 else emulated_token(
        r.task.sampling.seed, 0, cfg.vocab
    )
    handle = KvHandle(
        transfer_id=tid, src=ctx.self, npus=cfg.npus, model=cfg.model, num_tokens=p.num_tokens,
        block_ids=tuple(table[: blocks_needed(p.num_tokens, cfg.block_tokens)]),
        fingerprints=kv_fingerprints(cfg.model, p.num_tokens, p.block_hashes, cfg.block_tokens),
        block_bytes=cfg.kv_block_bytes, first_token_id=first,
    )  # fmt: skip
    ctx.record(TransferHeld(task_id=tid, handle=handle))
    msg = finished_message(r, "completed", "prefilled", ctx.now(), cfg, kv=handle)
    ctx.record(TaskEnded(task_id=tid, status="completed", reason="prefilled"))
    ctx.send(r.task.reply_to, msg)


def release(m: DpMaster, ctx: Context, transfer_id: str) -> None:
    st = m.state
    if transfer_id not in st.held:
        return
    ctx.record(TransferReleased(transfer_id=transfer_id))
    if transfer_id in st.rtc.seqs:
        ctx.record(rtc.free(st.rtc, transfer_id))
    m.advance(ctx)


def submit_decode(m: DpMaster, ctx: Context, msg: SubmitTask, out_len: int, stop: str) -> None:
    st, cfg = m.state, m.cfg
    if out_len <= 1:  # the prefill's token was the whole answer
        ctx.record(TaskQueued(task=msg, out_len=out_len, stop=stop, status=DEFERRED, emitted=1))
        m.end(ctx, st.reqs[msg.task_id], "completed", stop)
        return
    ctx.record(TaskQueued(task=msg, out_len=out_len, stop=stop, status=DEFERRED, emitted=1))
    try_receive(m, ctx)
    del cfg


def try_receive(m: DpMaster, ctx: Context) -> None:
    """Start receives for deferred tasks, in order, while the pool has room (backpressure)."""
    from deepserve.actors.flowserve.distflow import channel_for

    st, cfg = m.state, m.cfg
    for tid in list(st.deferred):
        r = st.reqs[tid]
        src = r.task.kv_source
        assert src is not None
        need = blocks_needed(src.num_tokens + 1, cfg.block_tokens)
        if not rtc.can_allocate(st.rtc, need):
            return  # FCFS: the head waits for room; later ones wait behind it
        ctx.record(rtc.allocate(st.rtc, tid, need))
        ctx.record(TaskStatus(task_id=tid, status=RECEIVING, copy_id=src.transfer_id))
        dst_blocks = tuple(rtc.block_table(st.rtc, tid)[: len(src.block_ids)])
        channel_for(m, ctx, src).receive(ctx, tid, src, dst_blocks)


def received(m: DpMaster, ctx: Context, tid: str, ok: bool, reason: str) -> None:
    st = m.state
    r = st.reqs.get(tid)
    if r is None or r.status != RECEIVING:
        return
    if r.cancelled is not None:
        m.end(ctx, r, "cancelled", r.cancelled)
    elif not ok:
        m.end(ctx, r, "failed", f"KV transfer failed: {reason}")
    else:
        computed = r.task.prompt.num_tokens
        ctx.record(TaskStatus(task_id=tid, status=WAITING, num_computed=computed))
    try_receive(m, ctx)
    m.advance(ctx)


def handles(msg: Message) -> bool:
    from deepserve.actors.flowserve.distflow.messages import KvRecvDone, KvRelease

    return isinstance(msg, KvRecvDone | KvRelease)


def handle(m: DpMaster, ctx: Context, msg: Message) -> None:
    from deepserve.actors.flowserve.distflow.messages import KvRecvDone, KvRelease

    if isinstance(msg, KvRecvDone):
        received(m, ctx, msg.task_id, msg.ok, msg.reason)
    elif isinstance(msg, KvRelease):
        release(m, ctx, msg.transfer_id)


def deferred_or_freed(m: DpMaster, ctx: Context) -> None:
    """After blocks were freed: deferred receives may fit now."""
    if m.state.deferred:
        try_receive(m, ctx)


__all__ += ["release", "received", "deferred_or_freed", "WAITING", "KvHandle"]
