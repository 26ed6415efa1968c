"""How a DP master fails its tasks (a mixin of `DpMaster`, actor.py): a forward that failed on
the device, a device lost for good, a task larger than the whole block pool. Split from actor.py
by concept."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.actors.flowserve.master.state import BatchEnded, MasterConfig, MasterState, Req
from deepserve.core import Context


class TaskFailures:
    """Failure paths of `DpMaster` (which sets `state` and `cfg`, and runs the loop)."""

    state: MasterState
    cfg: MasterConfig

    if TYPE_CHECKING:
        def advance(self, ctx: Context, interrupt: bool = True) -> None: ...
        def end(self, ctx: Context, r: Req, status: str, reason: str) -> None: ...

    def _fail_unfit(self, ctx: Context, preempted: tuple[str, ...]) -> None:
        if self.state.running:
            self.advance(ctx)
            return
        for tid in preempted:
            r = self.state.reqs[tid]
            self.end(ctx, r, "failed", f"needs more KV blocks than the DP group has "
                     f"({self.cfg.hbm_blocks}) at {r.num_tokens} tokens")  # fmt: skip
        self.advance(ctx)

    def _fail_on_lost_device(self, ctx: Context) -> None:
        """The device is lost (`DeviceLost`): fail every task held here but those of a batch
        still on the device (its error ends them), so the JE retries them elsewhere. New
        tasks are refused (`check`); heartbeats say why (`liveness.answer_heartbeat`)."""
        st = self.state
        busy = {e.task_id for e in st.in_flight.entries} if st.in_flight is not None else set()
        for tid in [t for t in st.reqs if t not in busy]:
            self.end(ctx, st.reqs[tid], "failed", f"device lost: {st.device_lost}")

    def _device_failed(self, ctx: Context, reason: str) -> None:
        fl = self.state.in_flight
        if fl is None or not fl.launched:
            return
        ctx.record(BatchEnded(step=fl.step, ends_s=(), failed=reason))
        for e in fl.entries:
            r = self.state.reqs.get(e.task_id)
            if r is not None:
                self.end(ctx, r, "failed", f"forward failed: {reason}")
        self.advance(ctx)
