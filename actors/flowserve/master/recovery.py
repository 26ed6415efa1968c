"""Fine-grained error handling in a DP master (xDeepServe §6.2 stage 3), both off by default
(`MasterConfig.token_recompute`, `MasterConfig.hbm_masking`: the old behaviour, and logs, stay):

- Token recomputation. A transient collective-link error (`NpuError(kind="link_error")`: a
  switch flap, BGP convergence) fails the pass running on the device. Nothing of that pass was
  committed — a batch's tokens are emitted only when it ends — so the master rolls it back
  (`BatchEnded(failed=...)`, the tasks keep their blocks and progress) and plans it again. It
  broadcasts `RollbackIteration` to every other DP group of its TE: their passes are part of
  the same collective, and a group busy-waiting in it hears the message (a master's handler
  always runs: the "dedicated thread" of the paper); each rolls back its own pass the same way.
  No request fails; each rollback is recorded (`IterationRolledBack`: the tokens the pass had
  computed, and the output tokens it would have produced, generated again by the re-execution).
  For an aggregated run (the simulation's fast path: many decode passes as one NPU request) the
  count is that of the iteration that met the error: the run's earlier passes were never
  committed either and are re-executed, but the master does not know how many there were.
- HBM fault masking. A fault in a part of the "kv" region (`HbmRegionFault.span`: the device
  names it `kv@lo-hi`) fails the graphs touching the region. Instead of giving the device up
  (`DeviceLost`, the TE failed over), the master asks the device to remap around that part
  (`NpuMaskRegion`), fails exactly the tasks whose KV blocks sat there (the JE retries or fails
  them as for any failed task), takes those blocks out of its pool for good (`RtcBlocksMasked`:
  held by the mask, so free + cached + referenced = capacity still adds up and the capacity
  that serves shrinks) and rolls the failed pass back for the others, which keep running. A
  fault of a whole region, or of the weights, is a lost device as before.
"""

from __future__ import annotations

import math
from typing import Any

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import BatchEnded, TransferReleased
from deepserve.actors.ports.npu import (
    HBM_FAULT,
    LINK_ERROR,
    NpuError,
    NpuForwardTruncate,
    NpuMaskRegion,
    region_span,
)
from deepserve.core import Context, Event, Message

KV_REGION = "kv"


class IterationRolledBack(Event, frozen=True, kw_only=True):
    """A DP group's pass, failed or abandoned, is rolled back: planned again from the same state."""

    step: int
    tasks: int
    tokens: int  # tokens the pass computed, computed again
    outputs: int  # output tokens the pass would have produced: re-generated
    origin: int  # the DP group whose pass met the error
    reason: str


class HbmFaultMasked(Event, frozen=True, kw_only=True):
    """A faulty part of the KV region is masked: its blocks leave the pool, its tasks failed."""

    name: str  # the device's name of the faulty part (`kv@lo-hi`)
    blocks: tuple[int, ...]  # the DP group's blocks in it (masked now, or once released)
    failed: tuple[str, ...]  # tasks whose KV sat there (and PD transfers held for a decode side)
    held: int = 0  # blocks still referenced by others (named caches, copies): masked later


class RollbackIteration(Message, frozen=True, kw_only=True):
    """DP master → every other DP master of its TE: roll back the pass in flight."""

    origin: int
    reason: str


def handles(m: Any, msg: NpuError) -> bool:
    """Whether this device error is one a setting makes the master survive."""
    cfg = m.cfg
    if msg.kind == LINK_ERROR:
        return bool(cfg.token_recompute)
    if msg.kind == HBM_FAULT and cfg.hbm_masking and msg.region:
        region, span = region_span(msg.region)
        return region == KV_REGION and span is not None
    return False


def on_error(m: Any, ctx: Context, msg: NpuError) -> None:
    """`handles(m, msg)` is true: recompute or mask."""
    fl = m.state.in_flight
    current = fl is not None and msg.req_id == f"fwd:{fl.step}"
    if msg.kind == LINK_ERROR:
        if not current:
            return  # a late error for a pass already rolled back
        reason = msg.reason  # the device's own words name it
        roll_back(m, ctx, m.cfg.dp, reason)
        for i in range(m.cfg.dp_groups):
            if i != m.cfg.dp:
                ctx.send(f"{m.cfg.te}/dp/{i}", RollbackIteration(origin=m.cfg.dp, reason=reason))
        m.advance(ctx)
        return
    mask(m, ctx, msg.region or "", msg.device)
    if current:
        roll_back(m, ctx, m.cfg.dp, f"{msg.device}: {msg.reason}, masked")
    m.advance(ctx)


def on_rollback(m: Any, ctx: Context, msg: RollbackIteration) -> None:
    """Another group met a transient link error: this group's pass is part of the same
    collective; roll it back and run it again."""
    fl = m.state.in_flight
    if fl is None or not fl.launched:
        return
    if fl.iterations > 1:  # a run: stop the device's work on it after the pass running now
        ctx.send(m.npu, NpuForwardTruncate(req_id=f"fwd:{fl.step}"))
    roll_back(m, ctx, msg.origin, f"rollback from dp {msg.origin}: {msg.reason}")
    m.advance(ctx)


def roll_back(m: Any, ctx: Context, origin: int, reason: str) -> None:
    st = m.state
    fl = st.in_flight
    if fl is None or not fl.launched:
        return
    tokens = outputs = tasks = 0
    for e in fl.entries:
        r = st.reqs.get(e.task_id)
        if r is None:
            continue
        tasks += 1
        tokens += e.n
        outputs += r.num_computed + e.n >= r.task.prompt.num_tokens + r.emitted  # the pass emits one
    ctx.record(BatchEnded(step=fl.step, ends_s=(), failed=f"rolled back: {reason}"))
    ctx.record(IterationRolledBack(step=fl.step, tasks=tasks, tokens=tokens, outputs=outputs, origin=origin,
                                   reason=reason))  # fmt: skip


def span_blocks(hbm_blocks: int, lo: float, hi: float) -> range:
    """The blocks of a pool of `hbm_blocks` that the part [lo, hi) of its region covers."""
    return range(math.floor(lo * hbm_blocks), min(hbm_blocks, math.ceil(hi * hbm_blocks)))


def mask(m: Any, ctx: Context, name: str, device: str) -> None:
    """Remap around the faulty part: the device first (so the next pass finds the region good
    again: messages to it arrive in order), then end the tasks holding blocks there and take
    the blocks out of the pool."""
    st = m.state
    _, span = region_span(name)
    assert span is not None
    blocks = span_blocks(m.cfg.hbm_blocks, *span)
    if not blocks:
        return
    ctx.send(device, NpuMaskRegion(req_id=f"mask:{name}", name=name))
    bad = set(blocks)
    hit = [tid for tid, sb in st.rtc.seqs.items() if tid in st.reqs and not bad.isdisjoint(sb.blocks)]
    why = f"its KV blocks sat in a faulty HBM part ({device}: {name}), masked"
    for tid in hit:
        m.end(ctx, st.reqs[tid], "failed", why)
    # PD prefill side: a transfer held for its decode side whose KV sat there is withdrawn (the
    # decode side's pin is refused and its JE retries the request), not served corrupted
    for xid in [x for x in st.held if x in st.rtc.seqs and not bad.isdisjoint(st.rtc.seqs[x].blocks)]:
        ctx.record(TransferReleased(transfer_id=xid))
        ctx.record(rtc.free(st.rtc, xid))
        hit.append(xid)
    ev, held = rtc.mask_blocks(st.rtc, blocks, why)
    ctx.record(HbmFaultMasked(name=name, blocks=tuple(blocks), failed=tuple(hit), held=len(held)))
    if ev is not None:
        ctx.record(ev)


def regenerated_tokens(events: Any) -> int:
    """Output tokens generated again after rollbacks, over (time, address, event) records."""
    return sum(e.outputs for _, _, e in events if type(e) is IterationRolledBack)
