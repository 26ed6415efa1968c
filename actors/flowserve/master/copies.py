"""The DP master's tier copies (a mixin of `DpMaster`, actor.py): the RTC executor's byte moves
between HBM and DRAM — a swap-out under pressure and a prefetch of queued prompts once a pass, a
populate on arrival — sent to the fabric as transfers, and their answers folded back. Split from
actor.py by concept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import (
    LOADING,
    WAITING,
    MasterConfig,
    MasterState,
    Req,
    TaskStatus,
)
from deepserve.actors.ports.link import LinkTransfer, LinkTransferDone, LinkTransferFailed
from deepserve.core import Context

COPY = "copy:"  # LinkTransfer ids of tier copies (populate, swap-out)


class TierCopies:
    """Tier copies of `DpMaster` (which sets `state`, `cfg` and `npu`, and runs the loop)."""

    state: MasterState
    cfg: MasterConfig
    npu: str

    if TYPE_CHECKING:
        def advance(self, ctx: Context, interrupt: bool = True) -> None: ...
        def end(self, ctx: Context, r: Req, status: str, reason: str) -> None: ...

    def _background_copies(self, ctx: Context) -> None:
        """Once a pass: swap cold blocks out under pressure; prefetch queued prompts' DRAM runs."""
        st = self.state
        if not self.cfg.dram_blocks:
            return
        swap = rtc.plan_swap_out(st.rtc)
        if swap is not None:
            ctx.record(swap)
            self._move(ctx, swap)
        if st.waiting:
            scan = st.rtc.config.prefetch_scan
            queued = [st.reqs[t].task.prompt.block_hashes for t in st.waiting[:scan]]
            fetch = rtc.plan_prefetch(st.rtc, queued)
            if fetch is not None:
                ctx.record(fetch)
                self._move(ctx, fetch)

    # ---- tier copies (the RTC executor's byte moves) ---------------------------------------
    def _move(self, ctx: Context, copy: rtc.RtcCopyStarted) -> None:
        cfg = self.cfg
        nbytes = len(copy.hbm) * cfg.kv_block_bytes
        src, dst = (self.npu, cfg.host) if copy.kind == rtc.SWAP_OUT else (cfg.host, self.npu)
        ctx.send(cfg.fabric, LinkTransfer(req_id=COPY + copy.copy_id, src=src, dst=dst,
                                          nbytes=max(nbytes, 1)))  # fmt: skip

    def _copy_done(self, ctx: Context, msg: LinkTransferDone | LinkTransferFailed) -> None:
        st = self.state
        copy_id = msg.req_id[len(COPY):]
        c = st.rtc.copies.get(copy_id)
        if c is None:
            return
        reason = msg.reason if isinstance(msg, LinkTransferFailed) else ""
        ctx.record(rtc.finish_copy(st.rtc, copy_id, isinstance(msg, LinkTransferDone), reason))
        seq = c.seq
        r = st.reqs.get(seq) if seq is not None else None
        if seq is not None and r is not None and r.status == LOADING:
            if r.cancelled is not None:
                self.end(ctx, r, "cancelled", r.cancelled)
            else:
                table = len(rtc.block_table(st.rtc, seq))
                computed = min(table * self.cfg.block_tokens, r.num_tokens - 1)
                ctx.record(TaskStatus(task_id=seq, status=WAITING, num_computed=computed))
        # A run's blocks are allocated for all its passes, so a finished copy can change the
        # next plan only through a task that may now be admitted (its populate is done, or the
        # copy's blocks became evictable again): with nothing waiting the run goes on, exactly
        # as the stepwise path would reschedule the same decode batch at every pass.
        self.advance(ctx, interrupt=bool(st.waiting or st.deferred))
