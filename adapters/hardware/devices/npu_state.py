"""The NPU's state, its events, and the pure `evolve_npu` that folds them."""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.npu import NpuForward, NpuForwardRun
from deepserve.adapters.hardware.devices.common import ReplyTo
from deepserve.core import Event

HEALTHY = "healthy"
CRASHED_STATUS = "crashed"
HUNG = "hung"


class Pending(msgspec.Struct, frozen=True, array_like=True):
    req: NpuForward | NpuForwardRun
    to: ReplyTo
    accepted_at_s: float


class Running(msgspec.Struct, frozen=True):
    pending: Pending
    started_at_s: float
    duration_s: float
    mode: str
    tokens: int
    # A run (NpuForwardRun): when each pass drawn so far ends. Pass 0 starts at started_at_s,
    # pass i+1 at ends_s[i] + gap_s (npu_run.pass_starts): the log need not carry the starts.
    ends_s: tuple[float, ...] = ()
    limit: int = 0  # a run: the passes it will run (its iterations, or fewer once truncated)


class NpuState(msgspec.Struct, frozen=True):
    status: str = HEALTHY
    reason: str = ""  # why it crashed or hung
    regions: dict[str, int] = {}  # bytes allocated per HBM region
    faulted: tuple[str, ...] = ()
    running: Running | None = None
    queue: tuple[Pending, ...] = ()
    ignored: tuple[tuple[str, ReplyTo], ...] = ()  # non-graph requests swallowed while hung
    completed: int = 0
    overflowed: int = 0  # requests dropped while hung because the bound was reached
    hbm_bytes_lost: int = 0  # HBM contents discarded by resets, cumulative
    # heartbeat leases promised (`NpuProbe.lease_s`): (holder, key, until_s)
    leases: tuple[tuple[str, str, float], ...] = ()


class NpuForwardQueued(Event, frozen=True):
    pending: Pending


class NpuForwardStarted(Event, frozen=True):
    """The queue's head starts; its duration is drawn once, here, so replay re-reads it."""

    at_s: float
    duration_s: float
    mode: str
    tokens: int
    # Set when the request starts as it arrives (idle device, empty queue): the one event
    # both queues and starts it, instead of NpuForwardQueued + this
    pending: Pending | None = None


class NpuRunStarted(Event, frozen=True):
    """The queue's head is a run of passes; its first passes' times are drawn here, once (pass
    i+1 starts the run's gap after pass i ends)."""

    at_s: float
    ends_s: tuple[float, ...]
    mode: str
    tokens: int
    limit: int = 0
    pending: Pending | None = None  # as NpuForwardStarted's: queued and started at once


class NpuRunExtended(Event, frozen=True):
    """The running run's next passes, drawn when the previous ones ended."""

    ends_s: tuple[float, ...]


class NpuRunTruncated(Event, frozen=True):
    """The run `req_id` (running or queued) now ends after `iterations` passes."""

    req_id: str
    iterations: int


class NpuForwardEnded(Event, frozen=True):
    at_s: float
    aborted_region: str | None  # set when an HBM fault killed the running graph


class NpuHbmGrown(Event, frozen=True):
    region: str
    nbytes: int


class NpuHbmShrunk(Event, frozen=True):
    region: str
    nbytes: int


class NpuHbmFaulted(Event, frozen=True):
    region: str


class NpuHbmMasked(Event, frozen=True):
    """HBM fault masking: the faulty part `name` (`npu.span_region`) is remapped around; graphs
    touching its region run again (its user keeps no data there)."""

    name: str


class NpuLinkErrored(Event, frozen=True):
    """A transient collective-link error; `aborted` the graph it failed ("": none was running)."""

    reason: str
    aborted: str


def faulted_hit(regions: tuple[str, ...], faulted: tuple[str, ...]) -> str | None:
    """The faulted region (or faulty part of one, `kv@0.25-0.5`) that `regions` touch, if any."""
    for f in faulted:
        if f in regions or f.partition("@")[0] in regions:
            return f
    return None


class NpuCrashed(Event, frozen=True):
    reason: str


class NpuHung(Event, frozen=True):
    reason: str


class NpuOverflowed(Event, frozen=True):
    req_id: str


class NpuReqIgnored(Event, frozen=True):
    req_id: str
    to: ReplyTo


class NpuLeases(Event, frozen=True):
    """The heartbeat leases the device now holds (a probe added one; a fault broke them)."""

    leases: tuple[tuple[str, str, float], ...]


class NpuWasReset(Event, frozen=True):
    hbm_bytes_lost: int
    clear_faults: bool


class NpuResetSkipped(Event, frozen=True):
    """A repair reset (`NpuReset.repair`) of a device with nothing to repair: no change."""

    reason: str


def _resize(regions: dict[str, int], region: str, delta: int) -> dict[str, int]:
    out = dict(regions)
    size = out.get(region, 0) + delta
    assert size >= 0, f"region {region!r} would hold {size} bytes"
    if size:
        out[region] = size
    else:
        out.pop(region, None)
    return out


def _truncate(st: NpuState, e: NpuRunTruncated) -> NpuState:
    replace = _replace
    run = st.running
    if run is not None and run.pending.req.req_id == e.req_id:
        n = e.iterations
        run = replace(run, ends_s=run.ends_s[:n], limit=n)
        return replace(st, running=replace(run, duration_s=run.ends_s[-1] - run.started_at_s))
    queue = tuple(
        replace(p, req=replace(p.req, iterations=e.iterations)) if p.req.req_id == e.req_id else p
        for p in st.queue
    )
    return replace(st, queue=queue)


_replace = msgspec.structs.replace


def evolve_npu(st: NpuState, e: Event) -> NpuState:
    replace = _replace
    # The graph events first, the most frequent first (per simulated request: ~3 ends, ~1.8
    # run starts, ~1.2 forward starts, ~0.8 truncations, ~0.5 extensions)
    if isinstance(e, NpuForwardEnded):
        assert st.running is not None, "no graph to end"
        return replace(st, running=None, completed=st.completed + (e.aborted_region is None))
    if isinstance(e, NpuRunStarted):
        assert st.running is None and (st.queue or e.pending), "a run started while another graph runs"
        head, queue = (e.pending, st.queue) if e.pending is not None else (st.queue[0], st.queue[1:])
        run = Running(
            head, e.at_s, e.ends_s[-1] - e.at_s, e.mode, e.tokens, e.ends_s,
            e.limit or head.req.iterations,  # type: ignore[union-attr]
        )
        return replace(st, running=run, queue=queue)
    if isinstance(e, NpuForwardStarted):
        assert st.running is None and (st.queue or e.pending), "a graph started while another runs"
        head, queue = (e.pending, st.queue) if e.pending is not None else (st.queue[0], st.queue[1:])
        run = Running(head, e.at_s, e.duration_s, e.mode, e.tokens)
        return replace(st, running=run, queue=queue)
    if isinstance(e, NpuRunTruncated):
        return _truncate(st, e)
    if isinstance(e, NpuRunExtended):
        cur = st.running
        assert cur is not None, "no run to extend"
        ends = cur.ends_s + e.ends_s
        return replace(st, running=replace(cur, ends_s=ends, duration_s=ends[-1] - cur.started_at_s))
    if isinstance(e, NpuForwardQueued):
        return replace(st, queue=(*st.queue, e.pending))
    if isinstance(e, NpuHbmGrown):
        return replace(st, regions=_resize(st.regions, e.region, e.nbytes))
    if isinstance(e, NpuHbmShrunk):
        return replace(st, regions=_resize(st.regions, e.region, -e.nbytes))
    if isinstance(e, NpuHbmFaulted):
        faulted = st.faulted if e.region in st.faulted else (*st.faulted, e.region)
        if st.status != HEALTHY:  # a hung device keeps its queue; a crashed one has none
            return replace(st, faulted=faulted)
        base = e.region.partition("@")[0]  # the faulty part of a region fails its region's graphs
        queue = tuple(p for p in st.queue if base not in p.req.regions)
        return replace(st, faulted=faulted, queue=queue)
    if isinstance(e, NpuHbmMasked):
        return replace(st, faulted=tuple(f for f in st.faulted if f != e.name))
    if isinstance(e, NpuLinkErrored):
        return st
    if isinstance(e, NpuCrashed):
        return replace(
            st, status=CRASHED_STATUS, reason=e.reason, running=None, queue=(), ignored=()
        )
    if isinstance(e, NpuHung):
        return replace(st, status=HUNG, reason=e.reason)
    if isinstance(e, NpuOverflowed):
        return replace(st, overflowed=st.overflowed + 1)
    if isinstance(e, NpuReqIgnored):
        return replace(st, ignored=(*st.ignored, (e.req_id, e.to)))
    if isinstance(e, NpuResetSkipped):
        return st
    if isinstance(e, NpuLeases):
        return replace(st, leases=e.leases)
    if isinstance(e, NpuWasReset):
        return NpuState(
            faulted=() if e.clear_faults else st.faulted, completed=st.completed,
            overflowed=st.overflowed, hbm_bytes_lost=st.hbm_bytes_lost + e.hbm_bytes_lost,
        )  # fmt: skip
    raise AssertionError(f"npu: unknown event {type(e).__name__}")
