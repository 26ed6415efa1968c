"""The NPU port: what an accelerator understands, whether emulated or real.

Every request carries a `req_id` chosen by the caller; every answer echoes it (and is sent as a
reply to the request's envelope, so `ctx.ask` works too). A healthy NPU answers every request; a
crashed one answers `NpuError(kind="crashed")`; a hung one answers nothing until it is reset
(then `NpuError(kind="reset")`), except requests beyond its queue bound, refused at once with
`NpuError(kind="queue_full")`.

HBM is divided into named regions ("weights", "kv", ...). A region is bookkeeping, not an
address range: the allocator checks the device's total capacity, and a faulted region makes the
allocations and graphs that touch it fail with an error naming it.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.core.messages import Message

# NpuError.kind values
CRASHED = "crashed"  # the device crashed: every request fails until a reset
HBM_FAULT = "hbm_fault"  # the request touches a faulted HBM region
RESET = "reset"  # the device was reset while the request was pending
QUEUE_FULL = "queue_full"  # the queue is at its bound (a hung device's too)
BAD_REQUEST = "bad_request"  # the request cannot run (unknown model, bad layout, ...)
LINK_ERROR = "link_error"  # a transient collective-link error failed the graph; the device is fine

DEFAULT_REGIONS: tuple[str, ...] = ("weights", "kv")


class SeqShape(msgspec.Struct, frozen=True, array_like=True):
    """One sequence of a batch: tokens computed now, on top of tokens already in the KV cache."""

    new_tokens: int
    context_tokens: int = 0


class NpuForward(Message, frozen=True, kw_only=True):
    """Run one forward pass (one graph) of a DP group's batch.

    A batch of only short sequences (decode, or decode + MTP drafts) runs as a compiled graph; a
    batch with any prefill chunk runs op by op — the phase (prefill, decode, mixed) is implied by
    `seqs`. The layout fields mirror the performance model's parallel layout."""

    req_id: str
    model: str
    seqs: tuple[SeqShape, ...]
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    shared_expert_ranks: int = 0
    redundant_experts: int = 0
    part: Literal["main", "mtp"] = "main"
    sample: bool = False  # add on-device sampling of the logits and the host sync
    regions: tuple[str, ...] = DEFAULT_REGIONS  # HBM regions the graph reads or writes
    # The graph starts no earlier than this long after the request arrives (the host's launch
    # gap, asked of the device instead of timed by the caller); 0: as soon as the device is free
    start_delay_s: float = 0.0


class NpuForwardDone(Message, frozen=True, kw_only=True):
    req_id: str
    duration_s: float  # execution time of the graph (the performance model's, plus variance)
    queued_s: float  # time spent waiting behind earlier graphs
    mode: str  # "graph" or "single_op"
    tokens: int


class NpuAlloc(Message, frozen=True, kw_only=True):
    req_id: str
    region: str
    nbytes: int


class NpuAllocOk(Message, frozen=True, kw_only=True):
    req_id: str
    region: str
    nbytes: int
    region_bytes: int  # the region's size after the allocation
    hbm_bytes_free: int


class NpuAllocFailed(Message, frozen=True, kw_only=True):
    req_id: str
    region: str
    nbytes: int
    reason: str
    hbm_bytes_free: int


class NpuFree(Message, frozen=True, kw_only=True):
    """Release `nbytes` of a region, or the whole region when `nbytes` is None."""

    req_id: str
    region: str
    nbytes: int | None = None


class NpuFreeOk(Message, frozen=True, kw_only=True):
    req_id: str
    region: str
    nbytes: int
    hbm_bytes_free: int


class NpuProbe(Message, frozen=True, kw_only=True):
    """A health probe: answered with the device's status; not at all when hung (until a reset,
    or with "queue_full" beyond the hung device's queue bound).

    `lease_s` > 0 (the simulator's heartbeat lease, actors/cluster/heartbeat.py): a healthy
    device also promises to tell `lease_to` (`NpuLeaseBroken`, naming `lease_key`) if it crashes,
    hangs, is reset or faults within `lease_s` — or if the pod using it is killed
    (`NpuVoidLeases`). Until then its user's heartbeats would all have been answered."""

    req_id: str
    lease_s: float = 0.0
    lease_to: str = ""
    lease_key: str = ""


class NpuLeaseBroken(Message, frozen=True, kw_only=True):
    """Device → a lease's holder: the promise of `NpuProbe.lease_s` no longer holds."""

    device: str
    key: str
    reason: str


class NpuVoidLeases(Message, frozen=True, kw_only=True):
    """Pod launcher → each NPU of a killed pod: break the leases given for `key_prefix` (the
    TE's) — its heartbeats go unanswered from now on; the monitor must ask again to see it."""

    key_prefix: str
    reason: str


class NpuStatus(Message, frozen=True, kw_only=True):
    req_id: str
    device: str
    status: str  # "healthy" (a crashed device answers NpuError, a hung one nothing)
    hbm_bytes: int
    hbm_bytes_free: int
    regions: dict[str, int]
    faulted_regions: tuple[str, ...]
    queue_depth: int  # graphs waiting, not counting the running one
    busy: bool


class NpuError(Message, frozen=True, kw_only=True):
    """A request that failed on the device; `kind` is one of the constants above."""

    req_id: str
    device: str
    kind: str
    reason: str
    region: str | None = None


NPU_REQUESTS: tuple[type, ...] = (NpuForward, NpuAlloc, NpuFree, NpuProbe)


# ---- aggregated decode runs (simulation fast path; additive) ------------------------------


class NpuForwardRun(Message, frozen=True, kw_only=True):
    """Run `iterations` consecutive forward passes of the same batch, each sequence appending its
    `new_tokens` to its context after every pass, with `gap_s` idle between passes (the host's
    launch gap). Equivalent to `iterations` NpuForwards sent `gap_s` after each previous answer,
    answered once (`NpuForwardRunDone`) — the simulation's fast path when nothing changes a batch.
    `NpuForwardTruncate` ends it early, after the pass that is running (or next to run)."""

    req_id: str
    model: str
    seqs: tuple[SeqShape, ...]
    iterations: int
    gap_s: float = 0.0
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    shared_expert_ranks: int = 0
    redundant_experts: int = 0
    part: Literal["main", "mtp"] = "main"
    sample: bool = False
    regions: tuple[str, ...] = DEFAULT_REGIONS
    start_delay_s: float = 0.0  # as NpuForward's: the first pass starts no earlier
    starts: bool = True  # False: the answer leaves `starts_s` empty (the caller recomputes them)
    # Pass 0's shapes when they differ from the passes after it (a batch whose prefill chunks
    # complete their prompts in pass 0, every sequence decoding from pass 1 on): then pass i >= 1
    # runs `seqs` appended i - 1 times. Empty: every pass runs `seqs` (pass i: appended i times).
    # `mode` and `tokens` in the answer describe the passes of `seqs`.
    head: tuple[SeqShape, ...] = ()
    # Passes 1..len(lead) when they too differ (needs a head: the chunks that finish longer
    # prompts, each pass's shapes); then pass i > len(lead) runs `seqs` appended i - 1 - len(lead)
    # times.
    lead: tuple[tuple[SeqShape, ...], ...] = ()


class NpuForwardTruncate(Message, frozen=True, kw_only=True):
    """End the run `req_id` after its pass running now (or, in a gap, the one about to start).
    Unknown or finished runs are ignored (the answer may be on its way). Not answered itself."""

    req_id: str


class NpuForwardRunDone(Message, frozen=True, kw_only=True):
    """The answer to a run: pass i ran from `starts_s[i]` to `ends_s[i]` (run clock times).
    `starts_s` is empty when the request asked `starts=False` (pass 0 starts `queued_s` plus
    the start delay after the request arrived, pass i+1 `gap_s` after pass i ends)."""

    req_id: str
    starts_s: tuple[float, ...]
    ends_s: tuple[float, ...]
    queued_s: float
    mode: str
    tokens: int  # tokens of one pass
    truncated: bool
    first_pass_s: float = 0.0  # pass 0's duration (a run with a `head`: the prefill's)

NPU_REQUESTS = (*NPU_REQUESTS, NpuForwardRun)


# ---- HBM fault masking (xDeepServe §6.2 stage 3) --------------------------------------------


def span_region(region: str, lo: float, hi: float) -> str:
    """The name of the faulty part [lo, hi) of a region (fractions of it): `kv@0.25-0.5`."""
    return f"{region}@{lo:g}-{hi:g}"


def region_span(name: str) -> tuple[str, tuple[float, float] | None]:
    """(region, (lo, hi)) of a `span_region` name; (name, None) for a whole region."""
    region, at, span = name.partition("@")
    if not at:
        return name, None
    lo, _, hi = span.partition("-")
    return region, (float(lo), float(hi))


class NpuMaskRegion(Message, frozen=True, kw_only=True):
    """User → device: remap around the faulty part `name` (a `span_region` name) and stop
    failing graphs for it — the user no longer keeps data there. Answered `NpuRegionMasked`."""

    req_id: str
    name: str


class NpuRegionMasked(Message, frozen=True, kw_only=True):
    req_id: str
    device: str
    name: str
    masked: bool  # False: the device had no such fault (masked already, or reset)
