"""The JE's `evolve`: every state change comes from a recorded event (in place: the kernel
rebuilds from snapshot + events after a failed handler)."""

from __future__ import annotations

from deepserve.actors.scheduling.locality import PromptTree
from deepserve.core import Event

from .messages import (
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


def evolve(s: JeState, e: Event, max_tree_blocks: int) -> JeState:
    t = type(e)
    if t is RouteDecided:
        _routed(s, e, max_tree_blocks)  # type: ignore[arg-type]
    elif t is JeTaskEnded:
        j = s.jobs[e.request_id]  # type: ignore[attr-defined]
        _close(s, j.te)
        j.te, j.acked = "", False
        if e.status != "completed":  # type: ignore[attr-defined]
            for te in (e.te, e.prefill_te):  # type: ignore[attr-defined]
                if te and te not in j.excluded:
                    j.excluded.append(te)
    elif t is TaskAcked:
        j = s.jobs[e.task_id.rpartition("/")[0]]  # type: ignore[attr-defined]
        j.acked = True
        if j.phase == "prefill":  # a prefill took work: idle ones exist, sweep eagerly again
            s.sweep_misses = 0
    elif t is PrefillWaiting:
        rid = e.request_id  # type: ignore[attr-defined]
        j = s.jobs[rid]
        _close(s, j.te)
        if j.refused:
            j.last_refused = j.refused
        j.te, j.phase, j.refused, j.fed, j.waited = "", "prefill", [], False, True
        if rid in s.waiting:
            s.waiting.remove(rid)
        if e.front:  # type: ignore[attr-defined]
            s.waiting.insert(0, rid)
        else:
            s.waiting.append(rid)
    elif t is SweepMissed:
        s.sweep_misses += 1
    elif t is PrefillSetAside:
        s.set_aside[e.te] = e.until_s  # type: ignore[attr-defined]
        s.set_aside_why[e.te] = e.reason  # type: ignore[attr-defined]
    elif t is RouteQueued:
        if e.decision.policy == "round_robin":  # type: ignore[attr-defined]
            s.turns += 1  # the turn was taken: the next request goes to the next candidate
    elif t is TaskStreamed:
        j = s.jobs[e.task_id.rpartition("/")[0]]  # type: ignore[attr-defined]
        j.streamed = True
        j.output_tokens = max(j.output_tokens, e.upto)  # type: ignore[attr-defined]
        if j.first_token_s is None:
            j.first_token_s = e.first_token_s  # type: ignore[attr-defined]
    elif t is OfferRefused:
        j = s.jobs[e.request_id]  # type: ignore[attr-defined]
        _close(s, j.te)
        j.te = ""
        if e.permanent:  # type: ignore[attr-defined]
            if e.te not in j.excluded:  # type: ignore[attr-defined]
                j.excluded.append(e.te)  # type: ignore[attr-defined]
        elif e.te:  # type: ignore[attr-defined]
            j.refused.append(e.te)  # type: ignore[attr-defined]
        else:  # a whole sweep refused: the next offer starts again from the best
            j.refused = []
    elif t is JePrefilled:
        j = s.jobs[e.request_id]  # type: ignore[attr-defined]
        j.first_token_s, j.kv, j.prefill_te = e.first_token_s, e.kv, e.te  # type: ignore[attr-defined]
        j.cached_prompt_tokens, j.prompt_tokens = e.cached_prompt_tokens, e.prompt_tokens  # type: ignore[attr-defined]
        j.queued_s, j.scheduled_s = e.queued_s, e.scheduled_s  # type: ignore[attr-defined]
        _close(s, j.te)
        j.te = ""
    elif t is JobAccepted:
        _accepted(s, e)  # type: ignore[arg-type]
    elif t is JobFinished:
        _finished(s, e)  # type: ignore[arg-type]
    elif t is MembershipChanged:
        _membership(s, e, max_tree_blocks)  # type: ignore[arg-type]
        key = f"{e.model}/{e.role}"  # type: ignore[attr-defined]
        if e.draining:  # type: ignore[attr-defined]
            s.draining[key] = list(e.draining)  # type: ignore[attr-defined]
        else:
            s.draining.pop(key, None)
    elif t is BatchAccepted:
        from .messages import Batch

        s.batches[e.batch_id] = Batch(count=e.count, deadline_s=e.deadline_s, reply_to=e.reply_to)  # type: ignore[attr-defined]
    elif t is JobParked:
        s.parked.append(e.request_id)  # type: ignore[attr-defined]
    elif t is JeLateMessage:
        s.late += 1
    elif t is JobCancelRequested:
        j = s.jobs[e.request_id]  # type: ignore[attr-defined]
        j.cancelled, j.cancel_completes = e.reason, e.completed  # type: ignore[attr-defined]
    return s


def _membership(s: JeState, e: MembershipChanged, max_tree_blocks: int) -> None:
    groups = s.groups.setdefault(e.model, {})
    left = set(groups.get(e.role, ())) - set(e.tes)
    groups[e.role] = list(e.tes)
    tree = s.trees.setdefault(e.model, PromptTree(max_blocks=max_tree_blocks))
    for te in sorted(left):  # gone from the group: a TE that comes back starts with an empty cache
        if not any(te in tes for tes in groups.values()):
            tree.forget(te)
            if te in s.publishing:
                s.publishing.remove(te)


def _close(s: JeState, te: str) -> None:
    if te and s.open.get(te, 0) > 0:
        s.open[te] -= 1


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
    j.streamed = j.streamed and e.phase == "decode"
    if e.phase != "decode":  # a (re)start: a failed attempt's output is discarded (never shown)
        j.start_attempt, j.output_tokens, j.first_token_s = e.attempt, 0, None
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


def _accepted(s: JeState, e: JobAccepted) -> None:
    s.jobs[e.request_id] = Job(
        model=e.model, prompt=e.prompt, sampling=e.sampling, reply_to=e.reply_to,
        arrival_s=e.arrival_s, predicted_bucket=e.predicted_bucket, batch_id=e.batch_id,
        queued=bool(e.batch_id), stream=e.stream,
    )  # fmt: skip
    if e.batch_id:
        s.batch_queue.append(e.request_id)
    else:
        s.online += 1


def _finished(s: JeState, e: JobFinished) -> None:
    rid = e.done.request_id
    j = s.jobs.pop(rid)
    _close(s, j.te)
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
