"""The JE's `evolve`: every state change comes from a recorded event (in place: the kernel
rebuilds from snapshot + events after a failed handler). One function per event kind, found by
the event's type in `_FOLD` (one look-up, whatever the number of kinds)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepserve.actors.scheduling.locality import PromptTree
from deepserve.core import Event

from .messages import (
    Batch,
    BatchAccepted,
    JeLateMessage,
    JePrefilled,
    JeState,
    JeTaskEnded,
    Job,
    JobAccepted,
    JobCancelRequested,
    JobFinished,
    JobParked,
    MembershipChanged,
    OfferRefused,
    PrefillSetAside,
    PrefillWaiting,
    RouteDecided,
    RouteQueued,
    SweepMissed,
    TaskAcked,
    TaskStreamed,
)
from .migration import KvImportEnded, KvImportSent, KvSurveyStarted, MigrationAsked, TaskMigrated
from .trees import KvEventsFolded, fold_kv_batch


def evolve(s: JeState, e: Event, max_tree_blocks: int) -> JeState:
    fold = _FOLD.get(type(e))
    if fold is not None:
        fold(s, e, max_tree_blocks)
    return s


def _routed(s: JeState, e: RouteDecided, max_tree_blocks: int) -> None:
    j = s.jobs[e.request_id]
    if e.request_id in s.parked:
        s.parked.remove(e.request_id)
    if e.request_id in s.waiting:
        s.waiting.remove(e.request_id)
    j.fed = e.decision.policy == "batch_forwarding"
    if j.queued:
        j.queued = False
        s.batch_queue.remove(e.request_id)
    te = e.decision.chosen
    if j.phase != e.phase:
        j.refused = []
    j.phase, j.task_id, j.te, j.attempt, j.acked = e.phase, e.task_id, te, e.attempt, False
    j.streamed = j.streamed and (e.phase == "decode" or j.migrations > 0)
    if e.phase != "decode":  # a (re)start: a failed attempt's output is discarded (never shown)
        j.start_attempt = e.attempt
        if not j.migrations:  # a moved stream keeps what its client was sent (and its first token's time)
            j.output_tokens, j.first_token_s = 0, None
    else:
        j.decodes += 1
    s.open[te] = s.open.get(te, 0) + 1
    if e.decision.policy == "round_robin":
        s.turns += 1
    if e.phase != "decode" and te not in s.publishing:
        # The fallback for a TE that publishes no KV events: it will compute (or already holds)
        # these blocks, ROUTED (SGLang router's approximation).
        tree = s.trees.setdefault(j.model, PromptTree(max_blocks=max_tree_blocks))
        tree.insert(te, j.prompt.block_hashes)


def _task_ended(s: JeState, e: JeTaskEnded, _: int) -> None:
    j = s.jobs[e.request_id]
    _close(s, j.te)
    j.te, j.acked = "", False
    if e.status != "completed":
        for te in (e.te, e.prefill_te):
            if te and te not in j.excluded:
                j.excluded.append(te)


def _acked(s: JeState, e: TaskAcked, _: int) -> None:
    j = s.jobs[e.task_id.rpartition("/")[0]]
    j.acked = True
    if e.direct:
        s.direct[j.te] = e.direct
    if j.phase == "prefill":  # a prefill took work: idle ones exist, sweep eagerly again
        s.sweep_misses = 0


def _waiting(s: JeState, e: PrefillWaiting, _: int) -> None:
    rid = e.request_id
    j = s.jobs[rid]
    _close(s, j.te)
    if j.refused:
        j.last_refused = j.refused
    j.te, j.phase, j.refused, j.fed, j.waited = "", "prefill", [], False, True
    if rid in s.waiting:
        s.waiting.remove(rid)
    if e.front:
        s.waiting.insert(0, rid)
    else:
        s.waiting.append(rid)


def _sweep_missed(s: JeState, e: SweepMissed, _: int) -> None:
    s.sweep_misses += 1


def _set_aside(s: JeState, e: PrefillSetAside, _: int) -> None:
    s.set_aside[e.te] = e.until_s
    s.set_aside_why[e.te] = e.reason


def _queued(s: JeState, e: RouteQueued, _: int) -> None:
    if e.decision.policy == "round_robin":
        s.turns += 1  # the turn was taken: the next request goes to the next candidate


def _streamed(s: JeState, e: TaskStreamed, _: int) -> None:
    j = s.jobs[e.task_id.rpartition("/")[0]]
    j.streamed = True
    j.output_tokens = max(j.output_tokens, e.upto)
    if j.first_token_s is None:
        j.first_token_s = e.first_token_s


def _offer_refused(s: JeState, e: OfferRefused, _: int) -> None:
    j = s.jobs[e.request_id]
    _close(s, j.te)
    j.te = ""
    if e.permanent:
        if e.te not in j.excluded:
            j.excluded.append(e.te)
    elif e.te:
        j.refused.append(e.te)
    else:  # a whole sweep refused: the next offer starts again from the best
        j.refused = []


def _prefilled(s: JeState, e: JePrefilled, _: int) -> None:
    j = s.jobs[e.request_id]
    j.kv, j.prefill_te = e.kv, e.te
    if not j.migrations:  # a moved stream's first token went out before
        j.first_token_s = e.first_token_s
    j.cached_prompt_tokens, j.prompt_tokens = e.cached_prompt_tokens, e.prompt_tokens
    j.queued_s, j.scheduled_s = e.queued_s, e.scheduled_s
    _close(s, j.te)
    j.te = ""


def _migrated(s: JeState, e: TaskMigrated, _: int) -> None:
    j = s.jobs[e.request_id]
    j.migrations += 1
    j.resume_from, j.asked = e.resume_from, None
    sv = j.surveying
    j.surveying = None
    j.kv_move = e.choice if e.choice.mode == "migrate" and e.choice.master else None
    j.switch = sv if sv is not None and sv.live and j.kv_move is not None else None
    j.output_tokens = max(j.output_tokens, e.resume_from)  # the frontend's answer may be ahead


def _asked(s: JeState, e: MigrationAsked, _: int) -> None:
    s.jobs[e.request_id].asked = e


def _surveying(s: JeState, e: KvSurveyStarted, _: int) -> None:
    s.jobs[e.request_id].surveying = e


def _import_sent(s: JeState, e: KvImportSent, _: int) -> None:
    j = s.jobs[e.request_id]
    j.importing, j.kv_move = e, None
    te = e.decision.chosen  # its task is as good as there: the load the next decisions see
    s.open[te] = s.open.get(te, 0) + 1


def _import_ended(s: JeState, e: KvImportEnded, _: int) -> None:
    j = s.jobs[e.request_id]
    if j.importing is not None:
        _close(s, j.importing.decision.chosen)  # the task's own RouteDecided counts it from here
    j.importing, j.switch = None, None


def _membership_changed(s: JeState, e: MembershipChanged, max_tree_blocks: int) -> None:
    _membership(s, e, max_tree_blocks)
    key = f"{e.model}/{e.role}"
    if e.draining:
        s.draining[key] = list(e.draining)
    else:
        s.draining.pop(key, None)


def _batch_accepted(s: JeState, e: BatchAccepted, _: int) -> None:
    s.batches[e.batch_id] = Batch(count=e.count, deadline_s=e.deadline_s, reply_to=e.reply_to)


def _parked(s: JeState, e: JobParked, _: int) -> None:
    s.parked.append(e.request_id)


def _late(s: JeState, e: JeLateMessage, _: int) -> None:
    s.late += 1


def _cancel_requested(s: JeState, e: JobCancelRequested, _: int) -> None:
    j = s.jobs[e.request_id]
    j.cancelled, j.cancel_completes = e.reason, e.completed


def _kv_folded(s: JeState, e: KvEventsFolded, max_tree_blocks: int) -> None:
    fold_kv_batch(s, e, max_tree_blocks)


def _membership(s: JeState, e: MembershipChanged, max_tree_blocks: int) -> None:
    groups = s.groups.setdefault(e.model, {})
    left = set(groups.get(e.role, ())) - set(e.tes)
    groups[e.role] = list(e.tes)
    tree = s.trees.setdefault(e.model, PromptTree(max_blocks=max_tree_blocks))
    for te in sorted(left):  # gone from the group: a TE that comes back starts with an empty cache
        if not any(te in tes for tes in groups.values()):
            tree.forget(te)
            s.direct.pop(te, None)  # a TE that comes back may come back otherwise
            if te in s.publishing:
                s.publishing.remove(te)


def _close(s: JeState, te: str) -> None:
    if te and s.open.get(te, 0) > 0:
        s.open[te] -= 1


def _accepted(s: JeState, e: JobAccepted, _: int) -> None:
    s.jobs[e.request_id] = Job(
        model=e.model, prompt=e.prompt, sampling=e.sampling, reply_to=e.reply_to,
        arrival_s=e.arrival_s, predicted_bucket=e.predicted_bucket, batch_id=e.batch_id,
        queued=bool(e.batch_id), stream=e.stream, epoch=e.epoch,
    )  # fmt: skip
    if e.batch_id:
        s.batch_queue.append(e.request_id)
    else:
        s.online += 1


def _finished(s: JeState, e: JobFinished, _: int) -> None:
    rid = e.done.request_id
    j = s.jobs.pop(rid)
    _close(s, j.te)
    if j.importing is not None:
        _close(s, j.importing.decision.chosen)
    if j.queued:
        s.batch_queue.remove(rid)
    if rid in s.parked:
        s.parked.remove(rid)
    if rid in s.waiting:
        s.waiting.remove(rid)
    if not j.batch_id:
        s.online -= 1
    ok = e.done.status == "completed"
    s.completed += ok
    s.failed += not ok
    b = s.batches.get(j.batch_id) if j.batch_id else None
    if b is not None:
        b.completed += ok
        b.failed += not ok
        if b.completed + b.failed == b.count:
            del s.batches[j.batch_id]


# Each fold takes its own event type; the table's value type says only "an event" (Any), so a
# fold is looked up by exactly the type it is written for.
_FOLD: dict[type, Callable[[JeState, Any, int], None]] = {
    RouteDecided: _routed, JeTaskEnded: _task_ended, TaskAcked: _acked, PrefillWaiting: _waiting,
    SweepMissed: _sweep_missed, PrefillSetAside: _set_aside, RouteQueued: _queued, TaskStreamed: _streamed,
    OfferRefused: _offer_refused, JePrefilled: _prefilled, JobAccepted: _accepted, JobFinished: _finished,
    MembershipChanged: _membership_changed, BatchAccepted: _batch_accepted, JobParked: _parked,
    JeLateMessage: _late, JobCancelRequested: _cancel_requested, KvEventsFolded: _kv_folded,
    TaskMigrated: _migrated, MigrationAsked: _asked, KvSurveyStarted: _surveying, KvImportSent: _import_sent,
    KvImportEnded: _import_ended,
}  # fmt: skip


# issue 33: the KV link verdicts' routing view (kvlinks.py)
from .kvlinks import KvRouteChanged, fold_route  # noqa: E402

_FOLD[KvRouteChanged] = fold_route
