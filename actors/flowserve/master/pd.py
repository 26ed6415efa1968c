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
from deepserve.actors.flowserve.distflow.channel import ChannelConfig, DistFlowChannel
from deepserve.actors.flowserve.distflow.messages import (
    CorruptKvBlock,
    DfHello,
    DfHelloAck,
    HoldExpired,
    KvPin,
    KvPinned,
    KvRecv,
    KvRecvDone,
    KvRelease,
)
from deepserve.actors.flowserve.distflow.probe import LinkProber
from deepserve.actors.flowserve.master.output import finished_message
from deepserve.actors.flowserve.master.state import (
    ARRIVED,
    DEFERRED,
    RECEIVING,
    WAITING,
    ChannelOpened,
    CorruptionArmed,
    CorruptionUsed,
    Req,
    TaskEnded,
    TaskQueued,
    TaskStatus,
    TransferHeld,
    TransferReleased,
)
from deepserve.actors.flowserve.messages import KV_TRANSFER_FAILED, KvHandle, SubmitTask
from deepserve.actors.flowserve.sampling import sampled_tokens
from deepserve.actors.flowserve.tokens import (
    ROOT_HASH,
    blocks_needed,
    combine,
    eos_token_id,
    kv_fingerprints,
)
from deepserve.core import Context, Message

if TYPE_CHECKING:
    from deepserve.actors.flowserve.master.actor import DpMaster

__all__ = ["ARRIVED", "DEFERRED", "RECEIVING", "WAITING", "KvHandle", "KvRelease", "handle", "handles", "hold", "received", "release",
           "submit_decode"]


def hold(m: DpMaster, ctx: Context, r: Req) -> None:
    """Prefill done: register the transfer (metadata only), keep the blocks, finish the task."""
    cfg, st = m.cfg, m.state
    p, tid, resume = r.task.prompt, r.task.task_id, r.task.resume_from
    table = rtc.block_table(st.rtc, tid)
    first = eos_token_id(cfg.vocab) if r.stop == "stop" and r.out_len == resume + 1 else sampled_tokens(
        r.task.sampling, resume, 1, cfg.vocab
    )[0]
    n = p.num_tokens + resume  # a resumed prefill's KV holds the tokens the client has too
    handle = KvHandle(
        transfer_id=tid, src=ctx.self, npus=cfg.npus, model=cfg.model, num_tokens=n,
        block_ids=tuple(table[: blocks_needed(n, cfg.block_tokens)]),
        fingerprints=_fingerprints(cfg.model, r.task, cfg.block_tokens),
        block_bytes=cfg.kv_block_bytes, first_token_id=first,
    )  # fmt: skip
    ctx.record(TransferHeld(task_id=tid, handle=handle))
    ctx.after(cfg.pd_hold_timeout_s, HoldExpired(transfer_id=tid), key=f"hold:{tid}")
    msg = finished_message(r, "completed", "prefilled", ctx.now(), cfg, kv=handle)
    ctx.record(TaskEnded(task_id=tid, status="completed", reason="prefilled"))
    ctx.send(r.task.reply_to, msg, corr=r.task.request_id)


def _fingerprints(model: str, task: SubmitTask, block_tokens: int) -> tuple[int, ...]:
    """The fingerprints of a transfer's blocks, computed alike on both sides: the prompt's, and
    for a resumed task (`resume_from`) blocks chained on over the output tokens it covers."""
    p, extra = task.prompt, task.resume_from
    if not extra:
        return kv_fingerprints(model, p.num_tokens, p.block_hashes, block_tokens)
    n = p.num_tokens + extra
    hashes = list(p.block_hashes)
    parent = hashes[-1] if hashes else ROOT_HASH
    for end in range((len(hashes) + 1) * block_tokens, n + 1, block_tokens):
        parent = combine(parent, end)  # a full block past the prompt: named by its end index
        hashes.append(parent)
    return kv_fingerprints(model, n, hashes, block_tokens)


def release(m: DpMaster, ctx: Context, transfer_id: str) -> None:
    st = m.state
    if transfer_id not in st.held:
        return
    ctx.record(TransferReleased(transfer_id=transfer_id))
    if transfer_id in st.rtc.seqs:
        ctx.record(rtc.free(st.rtc, transfer_id))
    m.advance(ctx)


def submit_decode(m: DpMaster, ctx: Context, msg: SubmitTask, out_len: int, stop: str) -> None:
    st = m.state
    emitted = 1 + msg.resume_from  # the prefill produced the token after the ones the client has
    ctx.record(TaskQueued(task=msg, out_len=out_len, stop=stop, status=ARRIVED, emitted=emitted, at_s=ctx.now()))
    if out_len <= emitted:  # the prefill's token was the whole answer
        m.end(ctx, st.reqs[msg.task_id], "completed", stop)
        return
    if st.deferred or not _fits(m, msg.task_id):
        ctx.record(TaskStatus(task_id=msg.task_id, status=DEFERRED))  # backpressure: wait
        return
    _receive(m, ctx, msg.task_id)


def _fits(m: DpMaster, tid: str) -> bool:
    src = m.state.reqs[tid].task.kv_source
    assert src is not None
    return rtc.can_allocate(m.state.rtc, blocks_needed(src.num_tokens + 1, m.cfg.block_tokens))


def try_receive(m: DpMaster, ctx: Context) -> None:
    """Start receives for deferred tasks, in order, while the pool has room (backpressure)."""
    for tid in list(m.state.deferred):
        if not _fits(m, tid):
            return  # FCFS: the head waits for room; later ones wait behind it
        _receive(m, ctx, tid)


def _receive(m: DpMaster, ctx: Context, tid: str) -> None:
    """Allocate the blocks the KV lands in and ask this pair's DistFlow channel to pull it."""
    st, cfg = m.state, m.cfg
    r = st.reqs[tid]
    src = r.task.kv_source
    assert src is not None
    ctx.record(rtc.allocate(st.rtc, tid, blocks_needed(src.num_tokens + 1, cfg.block_tokens)))
    ctx.record(TaskStatus(task_id=tid, status=RECEIVING, copy_id=src.transfer_id))
    dst_blocks = tuple(rtc.block_table(st.rtc, tid)[: len(src.block_ids)])
    expected = _fingerprints(cfg.model, r.task, cfg.block_tokens)
    corrupt = None
    for i, (target, block) in enumerate(st.corrupt):
        if target is None or target == tid:
            corrupt = block
            ctx.record(CorruptionUsed(index=i))
            break
    recv = KvRecv(task_id=tid, src=src, dst_npus=cfg.npus, dst_blocks=dst_blocks,
                  expected=expected, corrupt_block=corrupt)  # fmt: skip
    ctx.send(_channel(m, ctx, src.src), recv)


def _channel(m: DpMaster, ctx: Context, src_master: str) -> str:
    """The DistFlow channel of this decode group and `src_master` (spawned on first use)."""
    st, cfg = m.state, m.cfg
    if src_master not in st.channels:
        ctx.record(ChannelOpened(addr=src_master))
        addr = f"{ctx.self}/df/{st.channels.index(src_master)}"
        prober = f"{addr}/probe" if cfg.kv_link_probe_s > 0 else ""
        conf = ChannelConfig(src_master=src_master, dst_master=ctx.self, fabric=cfg.fabric,
                             mode=cfg.kv_transfer, granularity=cfg.kv_granularity,
                             layers=cfg.kv_layers, timeout_s=cfg.kv_transfer_timeout_s, prober=prober)  # fmt: skip
        ctx.spawn(addr, DistFlowChannel, config=conf.spawn_config())
        if prober:  # link probing (distflow/probe.py): its own actor, so the channel's state stays as it was
            ctx.spawn(prober, LinkProber, config={"fabric": cfg.fabric, "probe_s": cfg.kv_link_probe_s,
                                                  "report_to": cfg.health_to})  # fmt: skip
        return addr
    return f"{ctx.self}/df/{st.channels.index(src_master)}"


def received(m: DpMaster, ctx: Context, tid: str, ok: bool, reason: str) -> None:
    st = m.state
    r = st.reqs.get(tid)
    if r is None or r.status != RECEIVING:
        return
    if r.cancelled is not None:
        m.end(ctx, r, "cancelled", r.cancelled)
    elif not ok:
        m.end(ctx, r, "failed", f"{KV_TRANSFER_FAILED}: {reason}")
    else:
        computed = r.task.prompt.num_tokens + r.task.resume_from
        ctx.record(TaskStatus(task_id=tid, status=WAITING, num_computed=computed))
    try_receive(m, ctx)
    m.advance(ctx)


def handles(msg: Message) -> bool:
    return isinstance(msg, KvRecvDone | KvRelease | KvPin | CorruptKvBlock | HoldExpired | DfHello)


def handle(m: DpMaster, ctx: Context, msg: Message) -> None:
    if isinstance(msg, KvRecvDone):
        received(m, ctx, msg.task_id, msg.ok, msg.reason)
    elif isinstance(msg, KvRelease | HoldExpired):
        release(m, ctx, msg.transfer_id)
    elif isinstance(msg, KvPin):
        held = msg.transfer_id in m.state.held
        if held:
            ctx.cancel(f"hold:{msg.transfer_id}")  # pulled: DistFlow's completion releases it
        reason = "" if held else f"transfer {msg.transfer_id!r} is not held here (expired or freed)"
        ctx.reply(KvPinned(task_id=msg.task_id, ok=held, reason=reason))
    elif isinstance(msg, DfHello):
        ctx.reply(DfHelloAck(peer=ctx.self))
    elif isinstance(msg, CorruptKvBlock):
        ctx.record(CorruptionArmed(task_id=msg.task_id, block_index=msg.block_index))


