"""`evolve` of the DP-group master: folds its events (and the RTC's) into the state, in place.

A batch's end is folded twice over here: `_ended` (with `_ended_lead` for a run with lead
passes), the fast path `FOLDS` uses once a batch, with its per-entry helpers inlined and the
common case (no lead) apart; and `ended_reference`, the same fold in one readable loop, never
called on a hot path. tests/actors/flowserve/test_master_fast_paths.py folds every batch end of
whole runs through both and checks equal states. Change both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.recovery import HbmFaultMasked, IterationRolledBack
from deepserve.actors.flowserve.master.scheduler import has_head, has_head_reference
from deepserve.actors.flowserve.master.state import (
    DEFERRED,
    HELD,
    RUNNING,
    WAITING,
    BatchEnded,
    BatchInterrupted,
    BatchLaunched,
    BatchPlanned,
    ChannelOpened,
    CorruptionArmed,
    CorruptionUsed,
    DeviceLost,
    Entry,
    InFlight,
    MasterState,
    Req,
    TaskCancelMarked,
    TaskEnded,
    TaskQueued,
    TaskStatus,
    TransferHeld,
    TransferReleased,
)
from deepserve.core import Event

PREFILL_RATE_WEIGHT = 0.2  # EWMA weight of the newest prefill throughput sample
RUN_PASS_WEIGHT = 0.5  # EWMA weight of the newest run's mean pass time (contexts only grow)


def _drop(queue: list[str], task_id: str) -> None:
    if task_id in queue:
        queue.remove(task_id)


def _queued(st: MasterState, e: TaskQueued) -> None:
    st.reqs[e.task.task_id] = Req(
        task=e.task, out_len=e.out_len, stop=e.stop, status=e.status, emitted=e.emitted, queued_s=e.at_s
    )
    if e.status == WAITING:
        st.waiting.append(e.task.task_id)
    elif e.status == DEFERRED:
        st.deferred.append(e.task.task_id)


def _status(st: MasterState, e: TaskStatus) -> None:
    r = st.reqs[e.task_id]
    _drop(st.waiting, e.task_id)
    _drop(st.deferred, e.task_id)
    if r.status == RUNNING:
        _drop(st.running, e.task_id)
    r.status = e.status
    if e.num_computed is not None:
        r.num_computed = e.num_computed
    r.copy_id = e.copy_id
    if e.status == WAITING:
        st.waiting.insert(0, e.task_id) if e.front else st.waiting.append(e.task_id)
    elif e.status == DEFERRED:
        st.deferred.append(e.task_id)
    elif e.status == RUNNING:
        st.running.append(e.task_id)


def _planned(st: MasterState, e: BatchPlanned) -> None:
    for i, tid in enumerate(e.preempted):
        r = st.reqs[tid]
        _drop(st.running, tid)
        r.status, r.num_computed = WAITING, 0
        r.preemptions += 1
        st.waiting.insert(i, tid)
    for tid, computed in e.admitted:
        r = st.reqs[tid]
        _drop(st.waiting, tid)
        st.running.append(tid)
        r.status = RUNNING
        r.num_computed = max(r.num_computed, computed)
        if r.scheduled_s is None:  # the first scheduling, as vLLM's (a preempted task's stays)
            r.scheduled_s = e.at_s
        if not r.admitted and r.task.kind == "decode":
            r.admitted = True  # its prompt KV came from the prefill side: no cache statistics
        elif not r.admitted:
            r.admitted = True
            r.cached_tokens = r.num_computed
            st.prompt_tokens += r.task.prompt.num_tokens
            st.cached_prompt_tokens += r.num_computed
    if e.entries:
        st.in_flight = InFlight(step=e.step, entries=e.entries, iterations=e.iterations,
                                launched=e.launched, lead=e.lead, emit_from=e.emit_from)  # fmt: skip
    st.step = e.step + 1


def _ended(st: MasterState, e: BatchEnded) -> None:
    fl = st.in_flight
    st.in_flight = None
    if fl is None or e.failed:
        return
    if fl.lead:
        _ended_lead(st, e, fl)
        return
    # No lead (the common case): pass 0, then one token a pass for every entry.
    ends = e.ends_s
    passes = len(ends)
    if passes > 1:  # the mean decode pass
        sample = (ends[-1] - ends[0]) / (passes - 1)
        old = st.run_pass_s
        st.run_pass_s = sample if old == 0.0 else (1 - RUN_PASS_WEIGHT) * old + RUN_PASS_WEIGHT * sample
    reqs = st.reqs
    prefill = 0  # prefill tokens of pass 0, for the prefill rate's sample
    head = passes > 1 and has_head(st, fl.entries)
    for entry in fl.entries:
        r = reqs.get(entry.task_id)
        if r is None or r.status != RUNNING:
            continue
        n = entry.n
        if passes > 1:  # a run: pass 0 computes the entry's n tokens (a head's prompt), then one a pass
            k = passes if r.cancelled_at is None else _before(ends, r.cancelled_at)
            if k == 0:
                continue  # cancelled while pass 0 ran: as a single pass, nothing is delivered
            if n > 1:
                prefill += n
            r.num_computed += n + k - 1  # every pass emits: each prompt completes in pass 0
            r.emitted += k
            if head and r.first_token_s is None:
                r.first_token_s = ends[0]
            continue
        if r.cancelled_at is not None and ends[0] >= r.cancelled_at:
            continue  # cancelled while this pass ran: its token is not delivered
        if n > 1:
            prefill += n
        r.num_computed += n
        if r.num_computed >= r.task.prompt.num_tokens + r.emitted:  # Req.num_tokens, inlined
            r.emitted += 1
            if r.first_token_s is None:
                r.first_token_s = ends[0]
    s = e.prefill_s
    if s > 0 and prefill:
        w = PREFILL_RATE_WEIGHT
        st.prefill_tokens_per_s = (1 - w) * st.prefill_tokens_per_s + w * (prefill / s)


def _ended_lead(st: MasterState, e: BatchEnded, fl: InFlight) -> None:
    """`_ended` of a batch with lead passes (its prompts finish after pass 0)."""
    passes = len(e.ends_s)
    m = 1 + len(fl.lead)  # the passes before decoding (pass 0 and the lead's)
    if passes > m:  # the mean decode pass
        sample = (e.ends_s[-1] - e.ends_s[m - 1]) / (passes - m)
        old = st.run_pass_s
        st.run_pass_s = sample if old == 0.0 else (1 - RUN_PASS_WEIGHT) * old + RUN_PASS_WEIGHT * sample
    reqs = st.reqs
    # prefill tokens of each pass (pass 0, then the lead's), for the prefill rate's samples
    prefill = [0] * m
    head = passes > 1 and has_head(st, fl.entries)
    lead = _lead_tokens(fl.lead) if passes > 1 else {}
    for i, entry in enumerate(fl.entries):
        r = reqs.get(entry.task_id)
        if r is None or r.status != RUNNING:
            continue
        if passes > 1:  # pass 0, the lead's passes (each pass has entries), then one token a pass
            k = passes if r.cancelled_at is None else _before(e.ends_s, r.cancelled_at)
            if k == 0:
                continue  # cancelled while pass 0 ran: as a single pass, nothing is delivered
            ns = (entry.n, *lead.get(entry.task_id, ()))
            ran = ns[:k]
            for j, n in enumerate(ran):
                if n > 1:
                    prefill[j] += n
            r.num_computed += sum(ran) + max(0, k - len(ns))
            f = fl.emit_from[i] if fl.emit_from else 0
            if k > f:
                r.emitted += k - f
                if head and r.first_token_s is None:
                    r.first_token_s = e.ends_s[f]
            continue
        if r.cancelled_at is not None and e.ends_s[0] >= r.cancelled_at:
            continue  # cancelled while this pass ran: its token is not delivered
        if entry.n > 1:
            prefill[0] += entry.n
        r.num_computed += entry.n
        if r.num_computed >= r.num_tokens:
            r.emitted += 1
            if r.first_token_s is None:
                r.first_token_s = e.ends_s[0]
    # a lead pass that ran has a duration (the run may have ended before the others)
    for tokens, s in zip(prefill, (e.prefill_s, *e.lead_s), strict=False):
        if s > 0 and tokens:
            w = PREFILL_RATE_WEIGHT
            st.prefill_tokens_per_s = (1 - w) * st.prefill_tokens_per_s + w * (tokens / s)


def ended_reference(st: MasterState, e: BatchEnded) -> None:
    """`_ended` and `_ended_lead`, readable: pass 0, the lead's passes, then one token a pass."""
    fl = st.in_flight
    st.in_flight = None
    if fl is None or e.failed:
        return
    passes = len(e.ends_s)
    m = 1 + len(fl.lead)  # the passes before decoding
    if passes > m:  # the mean decode pass
        sample = (e.ends_s[-1] - e.ends_s[m - 1]) / (passes - m)
        old = st.run_pass_s
        st.run_pass_s = sample if old == 0.0 else (1 - RUN_PASS_WEIGHT) * old + RUN_PASS_WEIGHT * sample
    reqs = st.reqs
    prefill = [0] * m  # prefill tokens of each pass before decoding
    head = passes > 1 and has_head_reference(st, fl.entries)
    lead = _lead_tokens(fl.lead) if passes > 1 and fl.lead else {}
    for i, entry in enumerate(fl.entries):
        r = reqs.get(entry.task_id)
        if r is None or r.status != RUNNING:
            continue
        if passes == 1:
            if r.cancelled_at is not None and e.ends_s[0] >= r.cancelled_at:
                continue  # cancelled while this pass ran: its token is not delivered
            if entry.n > 1:
                prefill[0] += entry.n
            r.num_computed += entry.n
            if r.num_computed >= r.num_tokens:
                r.emitted += 1
                if r.first_token_s is None:
                    r.first_token_s = e.ends_s[0]
            continue
        k = passes if r.cancelled_at is None else _before(e.ends_s, r.cancelled_at)
        if k == 0:
            continue  # cancelled while pass 0 ran: nothing is delivered
        ns = (entry.n, *lead.get(entry.task_id, ()))  # its tokens in pass 0 and the lead's
        ran = ns[:k]
        for j, n in enumerate(ran):
            if n > 1:
                prefill[j] += n
        r.num_computed += sum(ran) + max(0, k - len(ns))  # then one token a pass
        f = fl.emit_from[i] if fl.emit_from else 0  # the first pass that emits its token
        if k > f:
            r.emitted += k - f
            if head and r.first_token_s is None:
                r.first_token_s = e.ends_s[f]
    for tokens, s in zip(prefill, (e.prefill_s, *e.lead_s), strict=False):
        if s > 0 and tokens:
            w = PREFILL_RATE_WEIGHT
            st.prefill_tokens_per_s = (1 - w) * st.prefill_tokens_per_s + w * (tokens / s)


def _lead_tokens(lead: tuple[tuple[Entry, ...], ...]) -> dict[str, list[int]]:
    """task id -> its tokens in each lead pass (0 where a pass left it out)."""
    out: dict[str, list[int]] = {}
    for j, entries in enumerate(lead):
        for x in entries:
            out.setdefault(x.task_id, [0] * len(lead))[j] = x.n
    return out


def _before(ends_s: tuple[float, ...], t: float) -> int:
    return sum(1 for x in ends_s if x < t)


def _task_ended(st: MasterState, e: TaskEnded) -> None:
    st.reqs.pop(e.task_id, None)
    _drop(st.waiting, e.task_id)
    _drop(st.running, e.task_id)
    _drop(st.deferred, e.task_id)
    st.finished += 1


def _launched(st: MasterState, e: BatchLaunched) -> None:
    assert st.in_flight is not None and st.in_flight.step == e.step
    st.in_flight.launched = True
    st.in_flight.iterations = e.iterations


def _interrupted(st: MasterState, e: BatchInterrupted) -> None:
    assert st.in_flight is not None and st.in_flight.step == e.step
    st.in_flight.interrupt = True


def _cancel_marked(st: MasterState, e: TaskCancelMarked) -> None:
    r = st.reqs[e.task_id]
    r.cancelled, r.cancelled_at = e.reason, e.at_s


def _transfer_held(st: MasterState, e: TransferHeld) -> None:
    st.held[e.handle.transfer_id] = e.handle
    held = st.reqs.get(e.task_id)
    if held is not None:
        _drop(st.running, e.task_id)
        held.status = HELD


def _transfer_released(st: MasterState, e: TransferReleased) -> None:
    st.held.pop(e.transfer_id, None)


def _channel_opened(st: MasterState, e: ChannelOpened) -> None:
    st.channels.append(e.addr)


def _corruption_armed(st: MasterState, e: CorruptionArmed) -> None:
    st.corrupt.append((e.task_id, e.block_index))


def _corruption_used(st: MasterState, e: CorruptionUsed) -> None:
    del st.corrupt[e.index]


def _device_lost(st: MasterState, e: DeviceLost) -> None:
    st.device_lost = e.reason


def _noted(st: MasterState, e: Event) -> None:
    pass


# The fold of each master event, by its exact type (no event type is subclassed): one dict
# lookup instead of a chain of isinstance tests, ~16 events a request.
FOLDS: dict[type, Callable[[MasterState, Any], None]] = {
    BatchEnded: _ended, BatchPlanned: _planned, TaskQueued: _queued, TaskStatus: _status,
    TaskEnded: _task_ended, BatchLaunched: _launched, BatchInterrupted: _interrupted,
    TaskCancelMarked: _cancel_marked, TransferHeld: _transfer_held,
    TransferReleased: _transfer_released, ChannelOpened: _channel_opened,
    CorruptionArmed: _corruption_armed, CorruptionUsed: _corruption_used, DeviceLost: _device_lost,
    # records of recovery.py (the state change is the BatchEnded / RTC event beside each)
    IterationRolledBack: _noted, HbmFaultMasked: _noted,
}  # fmt: skip
RTC_EVENT_TYPES = frozenset(rtc.RTC_EVENTS)  # `rtc.is_rtc_event` as a set test, not a call


def evolve_master(st: MasterState, e: Event) -> MasterState:
    t = type(e)
    if t in RTC_EVENT_TYPES:
        rtc.apply(st.rtc, e)
        return st
    fold = FOLDS.get(t)
    if fold is None:
        raise AssertionError(f"dp master: unknown event {t.__name__}")
    fold(st, e)
    return st
