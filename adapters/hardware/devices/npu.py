"""The NPU actor: an HBM allocator with named regions and a graph engine that runs one forward
pass at a time from a FIFO queue, with durations from the performance model (compute.py).

States: healthy; crashed (every request, pending or new, fails with kind "crashed"); hung
(accepts requests up to the queue bound and answers none — the running graph never finishes —
while requests beyond the bound are refused at once with "queue_full", as the driver's full
submission queue would: nothing is dropped unanswered);
and, orthogonally, faulted HBM regions (requests touching them fail naming the region). A reset
returns to healthy with empty HBM; what was pending fails with kind "reset". The faults and the
heartbeat leases are npu_faults.py's (a mixin of `Npu`).
"""

from __future__ import annotations

import math

from deepserve.actors.ports.faults import HbmRegionFault, NpuCrash, NpuHang, NpuLinkError, NpuReset
from deepserve.actors.ports.npu import (
    BAD_REQUEST,
    CRASHED,
    HBM_FAULT,
    QUEUE_FULL,
    NpuAlloc,
    NpuAllocFailed,
    NpuAllocOk,
    NpuError,
    NpuForward,
    NpuForwardDone,
    NpuForwardRun,
    NpuForwardRunDone,
    NpuForwardTruncate,
    NpuFree,
    NpuFreeOk,
    NpuMaskRegion,
    NpuProbe,
    NpuStatus,
    NpuVoidLeases,
)
from deepserve.adapters.hardware.calibration import DP_COMPUTE_CV
from deepserve.adapters.hardware.devices.common import (
    delay_until,
    respond,
)
from deepserve.adapters.hardware.devices.npu_draws import (
    factor_picks_raw,
    pass_starts,
    truncation_point,
)
from deepserve.adapters.hardware.devices.npu_faults import GRAPH_KEY, NpuFaults
from deepserve.adapters.hardware.devices.npu_run import (
    check_run,
    check_run_cost,
    chunk_ends,
    forward_cost_fast,
    forward_cost_s,
    next_chunk,
    run_shape,
)
from deepserve.adapters.hardware.devices.npu_state import (
    HEALTHY,
    HUNG,
    NpuForwardEnded,
    NpuForwardQueued,
    NpuForwardStarted,
    NpuHbmGrown,
    NpuHbmShrunk,
    NpuRunExtended,
    NpuRunStarted,
    NpuRunTruncated,
    NpuState,
    Pending,
    evolve_npu,
    faulted_hit,
)
from deepserve.adapters.hardware.specs import npu_spec
from deepserve.core import Actor, Context, Message

# isinstance takes these tuples in C; a `X | Y` union goes through its __instancecheck__
_FAULTS = (NpuCrash, NpuHang, HbmRegionFault, NpuReset, NpuLinkError)
_REQUESTS = (NpuForward, NpuForwardRun, NpuAlloc, NpuFree, NpuProbe)
_GRAPHS = (NpuForward, NpuForwardRun)


class NpuGraphDone(Message, frozen=True):
    req_id: str


_SIGMA = math.sqrt(math.log1p(DP_COMPUTE_CV**2))
_HALF_VAR = _SIGMA * _SIGMA / 2


def variance_factor(rng_draw: float) -> float:
    """A forward's duration factor: lognormal with mean 1 and coefficient of variation
    DP_COMPUTE_CV (calibration.py: a DP group's compute variation between two barriers).
    Takes a standard normal draw so the caller's seeded rng is the only source of chance."""
    return math.exp(_SIGMA * rng_draw - _HALF_VAR)  # the constants computed once, same floats


def _not_before(p: Pending) -> float:
    """The earliest start of a queued graph: its arrival plus the start delay it asked for."""
    delay = p.req.start_delay_s
    return p.accepted_at_s + delay if delay else p.accepted_at_s


class Npu(NpuFaults, Actor[NpuState]):
    """One NPU unit (a 910B chip or a 910C die). `queue_limit` bounds waiting requests."""

    # The state changes only in `evolve_npu`, so a snapshot copies it instead of folding its
    # events again (whole Mooncake trace: 0.28 s of ~29 s folded); each snapshot equals the
    # fold in tests/actors/flowserve/test_snapshot_from_live.py.
    snapshot_from_live = True

    def __init__(
        self, npu: str = "910b", hbm_bytes: int | None = None, queue_limit: int = 1024,
        variance: bool = True,
    ) -> None:  # fmt: skip
        self.npu = npu
        self.hbm_bytes = npu_spec(npu).hbm_bytes if hbm_bytes is None else hbm_bytes
        self.queue_limit = queue_limit
        self.variance = variance
        # The last request _enqueue costed, and its cost: a pure function's value, kept by
        # identity (not in the state: replay recomputes it, the same floats)
        self._costed: tuple[object, tuple[float, str, int]] = (None, (0.0, "", 0))
        # Likewise the head pass of the last run _enqueue checked (pricing it is the check):
        # priced once, not again when the run starts (0.4 % of a simulation's instructions).
        self._head_costed: tuple[object, tuple[float, ...] | None] = (None, None)

    def initial_state(self) -> NpuState:
        return NpuState()

    # The fold itself, not a method calling it: one Python frame less per recorded event
    evolve = staticmethod(evolve_npu)  # type: ignore[assignment]

    def handle(self, ctx: Context, msg: Message) -> None:
        st = self.state
        if type(msg) is NpuForward and st.status == HEALTHY:  # each pass: the chain's answer, at once
            self._enqueue(ctx, msg)
        elif isinstance(msg, NpuGraphDone):
            self._graph_done(ctx, msg)
        elif isinstance(msg, _FAULTS):
            self._fault(ctx, msg)
        elif isinstance(msg, NpuForwardTruncate):
            self._truncate(ctx, msg)
        elif isinstance(msg, NpuVoidLeases):
            self._break_leases(ctx, msg.reason, msg.key_prefix)
        elif isinstance(msg, NpuMaskRegion):
            self._mask(ctx, msg)
        elif not isinstance(msg, _REQUESTS):
            return
        elif st.status == HUNG:
            self._swallow(ctx, msg)
        elif st.status != HEALTHY:
            reason = f"{ctx.self} crashed: {st.reason}"
            respond(ctx, NpuError(req_id=msg.req_id, device=ctx.self, kind=CRASHED, reason=reason))
        elif isinstance(msg, _GRAPHS):
            self._enqueue(ctx, msg)
        elif isinstance(msg, NpuAlloc):
            self._alloc(ctx, msg)
        elif isinstance(msg, NpuFree):
            self._free(ctx, msg)
        else:
            if isinstance(msg, NpuProbe) and msg.lease_s > 0 and msg.lease_to:
                self._lease(ctx, msg)
            respond(ctx, self._status(ctx, msg.req_id))


    # ---- memory ------------------------------------------------------------
    def _free_bytes(self) -> int:
        return self.hbm_bytes - sum(self.state.regions.values())

    def _alloc(self, ctx: Context, msg: NpuAlloc) -> None:
        free = self._free_bytes()
        if msg.nbytes <= 0:
            reason = f"nbytes: must be > 0, got {msg.nbytes}"
        elif faulted_hit((msg.region,), self.state.faulted) is not None:
            reason = f"HBM region {msg.region!r} is faulted"
        elif msg.nbytes > free:
            reason = (
                f"out of HBM: region {msg.region!r} asked {msg.nbytes} bytes, "
                f"{free} of {self.hbm_bytes} free"
            )
        else:
            ctx.record(NpuHbmGrown(msg.region, msg.nbytes))
            region_bytes = self.state.regions[msg.region]
            respond(ctx,
                NpuAllocOk(
                    req_id=msg.req_id, region=msg.region, nbytes=msg.nbytes,
                    region_bytes=region_bytes, hbm_bytes_free=self._free_bytes(),
                )
            )  # fmt: skip
            return
        respond(ctx,
            NpuAllocFailed(
                req_id=msg.req_id, region=msg.region, nbytes=msg.nbytes, reason=reason,
                hbm_bytes_free=free,
            )
        )  # fmt: skip

    def _free(self, ctx: Context, msg: NpuFree) -> None:
        held = self.state.regions.get(msg.region, 0)
        nbytes = held if msg.nbytes is None else msg.nbytes
        if not 0 <= nbytes <= held:
            reason = f"nbytes: region {msg.region!r} holds {held} bytes, cannot free {nbytes}"
            respond(
                ctx, NpuError(req_id=msg.req_id, device=ctx.self, kind=BAD_REQUEST, reason=reason)
            )
            return
        if nbytes:
            ctx.record(NpuHbmShrunk(msg.region, nbytes))
        respond(
            ctx,
            NpuFreeOk(
                req_id=msg.req_id,
                region=msg.region,
                nbytes=nbytes,
                hbm_bytes_free=self._free_bytes(),
            ),
        )

    def _status(self, ctx: Context, req_id: str) -> NpuStatus:
        st = self.state
        return NpuStatus(
            req_id=req_id, device=ctx.self, status=st.status, hbm_bytes=self.hbm_bytes,
            hbm_bytes_free=self._free_bytes(), regions=dict(st.regions),
            faulted_regions=st.faulted, queue_depth=len(st.queue), busy=st.running is not None,
        )  # fmt: skip

    # ---- graphs ------------------------------------------------------------
    def _enqueue(self, ctx: Context, msg: NpuForward | NpuForwardRun) -> None:
        to = ctx.reply_handle()  # reply_to(ctx), without its frame
        st = self.state
        bad = faulted_hit(msg.regions, st.faulted) if st.faulted else None
        if bad is not None:
            self._error(ctx, to, msg.req_id, HBM_FAULT, f"HBM region {bad!r} is faulted", bad)
            return
        malformed = check_run(msg) if isinstance(msg, NpuForwardRun) else None
        if not 0.0 <= msg.start_delay_s < math.inf:
            malformed = f"start_delay_s: must be finite and >= 0, got {msg.start_delay_s}"
        if malformed is not None:
            self._error(ctx, to, msg.req_id, BAD_REQUEST, malformed)
            return
        try:  # reject what can never run now, not when it reaches the head of the queue
            if isinstance(msg, NpuForwardRun):
                # its passes are priced as they are drawn
                self._head_costed = (msg, check_run_cost(self.npu, msg))
            else:
                self._costed = (msg, forward_cost_fast(self.npu, msg))
        except (ValueError, KeyError) as exc:
            self._error(ctx, to, msg.req_id, BAD_REQUEST, str(exc))
            return
        if len(st.queue) >= self.queue_limit:
            reason = f"graph queue is full ({self.queue_limit} waiting)"
            self._error(ctx, to, msg.req_id, QUEUE_FULL, reason)
            return
        pending = Pending(msg, to, ctx.now())
        if st.running is None and not st.queue:  # healthy here: starts at once
            self._start_next(ctx, pending)
            return
        ctx.record(NpuForwardQueued(pending))
        self._start_next(ctx)

    def _start_next(self, ctx: Context, arrived: Pending | None = None) -> None:
        """Start the queue's head, or `arrived` (a request starting as it arrives: its start
        event queues it too)."""
        st = self.state
        if arrived is None and (st.running is not None or not st.queue or st.status != HEALTHY):
            return
        head = arrived if arrived is not None else st.queue[0]
        now = ctx.now()
        # The graph starts when the device is free and its start delay has passed; the device
        # is busy (holds it as running) from now, so nothing overtakes it.
        start = _not_before(head)
        start = now if start <= now else start
        if isinstance(head.req, NpuForwardRun):
            self._start_run(ctx, head.req, start, arrived)
            return
        costed = self._costed  # usually the request just validated: its cost is known
        cost = costed[1] if costed[0] is head.req else forward_cost_s(self.npu, head.req)
        expected_s, mode, tokens = cost
        # variance_factor(ctx.rng.gauss(0.0, 1.0)), inlined: the same floats
        factor = math.exp(_SIGMA * ctx.rng.gauss(0.0, 1.0) - _HALF_VAR) if self.variance else 1.0
        duration = expected_s * factor
        ctx.record(NpuForwardStarted(start, duration, mode, tokens, arrived))
        # Fires at start + duration, the float a timer armed at the start would reach
        delay = duration if start == now else delay_until(now, start + duration)
        ctx.after(delay, NpuGraphDone(head.req.req_id), key=GRAPH_KEY)

    def _graph_done(self, ctx: Context, msg: NpuGraphDone) -> None:
        run = self.state.running
        if run is None or run.pending.req.req_id != msg.req_id or self.state.status != HEALTHY:
            return  # a stale timer: the graph was aborted
        req = run.pending.req
        if isinstance(req, NpuForwardRun) and len(run.ends_s) < run.limit:
            self._extend_run(ctx, req, len(run.ends_s), run.limit, run.ends_s[-1])
            return
        ctx.record(NpuForwardEnded(ctx.now(), None))
        queued = run.started_at_s - _not_before(run.pending)  # waited behind other graphs
        queued = queued if queued > 0.0 else 0.0
        if isinstance(req, NpuForwardRun):
            starts = pass_starts(run.started_at_s, run.ends_s, req.gap_s) if req.starts else ()
            done: NpuForwardRunDone | NpuForwardDone = NpuForwardRunDone(
                req_id=msg.req_id, starts_s=starts, ends_s=run.ends_s, queued_s=queued,
                mode=run.mode, tokens=run.tokens,
                truncated=run.limit < req.iterations,
                first_pass_s=run.ends_s[0] - run.started_at_s,
            )  # fmt: skip
        else:
            done = NpuForwardDone(
                req_id=msg.req_id, duration_s=run.duration_s, queued_s=queued, mode=run.mode,
                tokens=run.tokens,
            )  # fmt: skip
        ctx.reply(done, run.pending.to)  # answer(), without its frame
        self._start_next(ctx)

    def _run_passes(
        self, ctx: Context, req: NpuForwardRun, lo: int, hi: int, start_s: float
    ) -> tuple[float, ...]:
        """When passes lo..hi-1 of a run end: the model's costs, each times its own variance
        factor (one 64-bit draw of ctx.rng seeds the chunk's factors, npu_draws.variance_factors)."""
        raw = factor_picks_raw(ctx.rng, hi - lo) if self.variance else None
        head_s = self._head_costed[1] if self._head_costed[0] is req else None
        return chunk_ends(self.npu, req, lo, hi, start_s, head_s, raw)

    def _start_run(self, ctx: Context, req: NpuForwardRun, start: float, arrived: Pending | None) -> None:
        """Draw the run's first chunk of passes and arm the one timer at its last pass's end."""
        mode, tokens = run_shape(req)
        hi = next_chunk(0, req.iterations)
        ends = self._run_passes(ctx, req, 0, hi, start)
        ctx.record(NpuRunStarted(start, ends, mode, tokens, req.iterations, arrived))
        # Where a timer armed at the start would fire (start + (end - start)), to the bit
        now = ctx.now()
        due = ends[-1] - now if start == now else delay_until(now, start + (ends[-1] - start))
        ctx.after(due, NpuGraphDone(req.req_id), key=GRAPH_KEY)

    def _extend_run(self, ctx: Context, req: NpuForwardRun, done: int, limit: int, last_end: float) -> None:
        hi = done + next_chunk(done, limit)
        ends = self._run_passes(ctx, req, done, hi, last_end + req.gap_s)
        ctx.record(NpuRunExtended(ends))
        ctx.after(ends[-1] - ctx.now(), NpuGraphDone(req.req_id), key=GRAPH_KEY)

    def _truncate(self, ctx: Context, msg: NpuForwardTruncate) -> None:
        st = self.state
        if st.status != HEALTHY:
            return
        run = st.running
        if run is not None and run.pending.req.req_id == msg.req_id and run.ends_s:
            keep = truncation_point(run.ends_s, ctx.now())
            if keep < run.limit:
                ctx.record(NpuRunTruncated(msg.req_id, keep))
                if keep < len(run.ends_s):  # else the armed timer already ends that pass
                    end = self.state.running.ends_s[-1]  # type: ignore[union-attr]
                    ctx.after(end - ctx.now(), NpuGraphDone(msg.req_id), key=GRAPH_KEY)
            return
        queued = next((p for p in st.queue if p.req.req_id == msg.req_id), None)
        if queued is not None and isinstance(queued.req, NpuForwardRun) and queued.req.iterations > 1:
            ctx.record(NpuRunTruncated(msg.req_id, 1))


