"""The NPU actor's faults and heartbeat leases (a mixin of `Npu`, npu.py): a crash, a hang, a
reset, a faulted or masked HBM region, a transient link error; and the leases a healthy device
gives its heartbeat's monitor, broken by any of those. Split from npu.py by concept: the graph
engine and the allocator stay there."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.actors.ports.faults import HbmRegionFault, NpuCrash, NpuHang, NpuLinkError, NpuReset
from deepserve.actors.ports.npu import (
    CRASHED,
    HBM_FAULT,
    LINK_ERROR,
    QUEUE_FULL,
    RESET,
    NpuAlloc,
    NpuError,
    NpuForward,
    NpuForwardRun,
    NpuFree,
    NpuLeaseBroken,
    NpuMaskRegion,
    NpuProbe,
    NpuRegionMasked,
    region_span,
    span_region,
)
from deepserve.adapters.hardware.devices.common import ReplyTo, answer, reply_to, respond
from deepserve.adapters.hardware.devices.npu_state import (
    HEALTHY,
    NpuCrashed,
    NpuForwardEnded,
    NpuForwardQueued,
    NpuHbmFaulted,
    NpuHbmMasked,
    NpuHung,
    NpuLeases,
    NpuLinkErrored,
    NpuOverflowed,
    NpuReqIgnored,
    NpuResetSkipped,
    NpuState,
    NpuWasReset,
    Pending,
)
from deepserve.core import Context, Message

GRAPH_KEY = "graph"  # the one completion timer: at most one graph runs


class NpuFaults:
    """Faults and leases of `Npu` (which sets `state` and `queue_limit`, and starts graphs)."""

    state: NpuState
    queue_limit: int

    if TYPE_CHECKING:
        def _start_next(self, ctx: Context, arrived: Pending | None = None) -> None: ...

    # ---- heartbeat leases ----------------------------------------------------
    def _lease(self, ctx: Context, msg: NpuProbe) -> None:
        """Promise `msg.lease_to` word of any fault within `lease_s` (replacing its earlier
        promise for the same key; expired ones are dropped here)."""
        now = ctx.now()
        keep = tuple(le for le in self.state.leases if le[2] > now and (le[0], le[1]) != (msg.lease_to, msg.lease_key))
        ctx.record(NpuLeases((*keep, (msg.lease_to, msg.lease_key, now + msg.lease_s))))

    def _break_leases(self, ctx: Context, reason: str, prefix: str = "") -> None:
        """Tell every holder of a lease still running (whose key starts with `prefix`) that it
        no longer holds; the device keeps the others."""
        now, leases = ctx.now(), self.state.leases
        if not leases:
            return
        broken = [le for le in leases if le[2] > now and le[1].startswith(prefix)]
        ctx.record(NpuLeases(tuple(le for le in leases if le[2] > now and not le[1].startswith(prefix))))
        for holder, key, _ in broken:
            ctx.send(holder, NpuLeaseBroken(device=ctx.self, key=key, reason=reason))

    def _error(self, ctx: Context, to: ReplyTo, req_id: str, kind: str, reason: str,
               region: str | None = None) -> None:  # fmt: skip
        error = NpuError(req_id=req_id, device=ctx.self, kind=kind, reason=reason, region=region)
        answer(ctx, to, error)

    # ---- faults ------------------------------------------------------------
    def _swallow(
        self, ctx: Context, msg: NpuForward | NpuForwardRun | NpuAlloc | NpuFree | NpuProbe
    ) -> None:
        """Hung: keep the request (a reset answers it), never reply. Bounded: beyond the bound
        the request is refused at once — a dropped request would never be answered, not even
        by a reset, since the device keeps no handle to it."""
        st = self.state
        if len(st.queue) + len(st.ignored) >= self.queue_limit:
            ctx.record(NpuOverflowed(msg.req_id))
            reason = f"request queue is full ({self.queue_limit} waiting)"
            self._error(ctx, reply_to(ctx), msg.req_id, QUEUE_FULL, reason)
        elif isinstance(msg, NpuForward | NpuForwardRun):
            ctx.record(NpuForwardQueued(Pending(msg, reply_to(ctx), ctx.now())))
        else:
            ctx.record(NpuReqIgnored(msg.req_id, reply_to(ctx)))

    def _fault(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if isinstance(msg, NpuCrash | NpuHang) and st.status != HEALTHY:
            return  # already down: a second crash or hang changes nothing
        skipped = isinstance(msg, NpuReset) and msg.repair and st.status == HEALTHY and not st.faulted
        if not skipped:  # whatever the fault, a promise of answered heartbeats is off
            self._break_leases(ctx, f"{type(msg).__name__} on {ctx.self}")
            st = self.state
        if isinstance(msg, NpuCrash):
            ctx.record(NpuCrashed(msg.reason))
            self._fail_pending(ctx, st, CRASHED, f"{ctx.self} crashed: {msg.reason}")
        elif isinstance(msg, NpuHang):
            ctx.record(NpuHung(msg.reason))
            ctx.cancel(GRAPH_KEY)
        elif isinstance(msg, HbmRegionFault):
            self._region_fault(ctx, span_region(msg.region, *msg.span) if msg.span else msg.region)
        elif isinstance(msg, NpuLinkError):
            self._link_error(ctx, msg.reason)
        elif isinstance(msg, NpuReset) and msg.repair and st.status == HEALTHY and not st.faulted:
            ctx.record(NpuResetSkipped("healthy: nothing to repair"))
        elif isinstance(msg, NpuReset):
            ctx.record(NpuWasReset(sum(st.regions.values()), msg.clear_faults))
            ctx.cancel(GRAPH_KEY)
            self._fail_pending(ctx, st, RESET, f"{ctx.self} was reset")

    def _fail_pending(self, ctx: Context, before: NpuState, kind: str, reason: str) -> None:
        """Answer everything that was pending in `before` with an error (crash, reset)."""
        pending = ([before.running.pending] if before.running else []) + list(before.queue)
        for p in pending:
            self._error(ctx, p.to, p.req.req_id, kind, reason)
        for req_id, to in before.ignored:
            self._error(ctx, to, req_id, kind, reason)

    def _region_fault(self, ctx: Context, region: str) -> None:
        """`region` is a whole region or the faulty part of one (`span_region`): the graphs
        that touch its region fail naming it (the error's `region`)."""
        st = self.state
        ctx.record(NpuHbmFaulted(region))
        reason = f"HBM region {region!r} is faulted"
        base = region_span(region)[0]
        run = st.running.pending if st.running else None
        if st.status == HEALTHY and run is not None and base in run.req.regions:
            ctx.record(NpuForwardEnded(ctx.now(), region))
            ctx.cancel(GRAPH_KEY)
            self._error(ctx, run.to, run.req.req_id, HBM_FAULT, reason, region)
        if st.status == HEALTHY:
            for p in st.queue:
                if base in p.req.regions:
                    self._error(ctx, p.to, p.req.req_id, HBM_FAULT, reason, region)
            self._start_next(ctx)

    def _link_error(self, ctx: Context, why: str) -> None:
        """A transient collective-link error: the graph running now fails (`LINK_ERROR`); the
        device stays healthy, its queue runs on."""
        st = self.state
        run = st.running.pending if st.running else None
        ctx.record(NpuLinkErrored(why, run.req.req_id if run is not None else ""))
        if st.status != HEALTHY or run is None:
            return
        ctx.record(NpuForwardEnded(ctx.now(), LINK_ERROR))
        ctx.cancel(GRAPH_KEY)
        self._error(ctx, run.to, run.req.req_id, LINK_ERROR, f"{ctx.self}: transient link error: {why}")
        self._start_next(ctx)

    def _mask(self, ctx: Context, msg: NpuMaskRegion) -> None:
        """HBM fault masking: the runtime remaps the region's virtual memory around the faulty
        part, which its user no longer uses; graphs touching the region run again."""
        masked = msg.name in self.state.faulted and region_span(msg.name)[1] is not None
        if masked:
            ctx.record(NpuHbmMasked(msg.name))
        respond(ctx, NpuRegionMasked(req_id=msg.req_id, device=ctx.self, name=msg.name, masked=masked))
