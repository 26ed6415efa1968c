"""The Job Executor (DeepServe §3): request → job → tasks on TEs, tracked to a terminal state.

A chat job on a colocated TE is one `chat` task; on a PD pair a `prefill` task, then a `decode`
task carrying the prefill's KV handle (xDeepServe §5.1). The policy (by name, actors/scheduling)
picks the TE; every pick is a recorded `RouteDecided` with the inputs it saw. A failed task is
retried on another TE while nothing has streamed to the client (at most `max_attempts`), otherwise
the request fails with the reason; a client that does not stream (`JobRequest.stream`) has seen
nothing before the job ends, so its task is retried from scratch whatever it produced. With on-demand forwarding (P/D-Serve §3.5) a prefill refusal is not a
failure: the JE offers the task to the next prefill (fewest open streams first) until the TTFT
deadline. Group membership comes from the cluster manager (`TeGroupMembership`, pushed).
Batch jobs wait in a queue and are dispatched only while online traffic leaves room.
Tokens are not forwarded: the timings arrive with `TaskFinished` (the simulator's need). With
`stream_to` (a live frontend) the TEs stream straight there (xDeepServe §4.2's output
short-circuit, `SubmitTask.stream_to`) and send the JE only each task's first chunk: it learns
that output went out (no retry after that), not every chunk.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.master.pd import KvRelease
from deepserve.actors.flowserve.messages import (
    KV_TRANSFER_FAILED,
    SubmitTask,
    TaskAccepted,
    TaskFinished,
    TaskRejected,
    TaskTokens,
)
from deepserve.actors.flowserve.rtc.kv_events import KVEventBatch
from deepserve.actors.scheduling import Candidate, Decision, Policy, RouteRequest
from deepserve.actors.scheduling.decision import Excluded, ranked
from deepserve.actors.scheduling.forwarding import is_busy, next_offer, te_down
from deepserve.actors.scheduling.least_load import select_least_load
from deepserve.actors.scheduling.predictor import DecodeLengthTree, bucket_memo
from deepserve.actors.workload.messages import EndOfRun, RequestDone
from deepserve.core import Actor, Context, Event, Message

from . import failover, routing
from .config import MAX_BATCH_ITEMS, MAX_JOBS, JeConfig
from .messages import (
    AcceptTimeout,
    BatchAccepted,
    BatchDone,
    BatchTick,
    CancelDeadline,
    CancelJob,
    JeLateMessage,
    JePrefilled,
    JeState,
    JeTaskEnded,
    Job,
    JobAccepted,
    JobFinished,
    JobParked,
    JobRequest,
    OfferAgain,
    OfferRefused,
    ParkTimeout,
    PrefillSetAside,
    PrefillWaiting,
    RouteDecided,
    RouteQueued,
    SubmitBatch,
    SweepMissed,
    SweepTick,
    TaskAcked,
    TaskStreamed,
    TeGroupMembership,
)
from .state import evolve
from .trees import KvEventsFolded, fold_kv_batch


def task_id(request_id: str, phase: str, attempt: int) -> str:
    return f"{request_id}/{phase}.{attempt}"


class JobExecutor(Actor[JeState]):
    snapshot_every = 4096

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, JeConfig)
        self.policy = Policy(self.cfg.policy, self.cfg.params, self.cfg.heatmap)
        p = self.cfg.predictor
        self.predictor = msgspec.convert(p, DecodeLengthTree) if p is not None else None
        self._bucket = bucket_memo(self.predictor, self.cfg.kv_block_tokens) if self.predictor else None

    def initial_state(self) -> JeState:
        return JeState()

    def evolve(self, s: JeState, e: Event) -> JeState:
        if type(e) is KvEventsFolded:
            return fold_kv_batch(s, e, self.cfg.max_tree_blocks)  # type: ignore[arg-type]
        return evolve(s, e, self.cfg.max_tree_blocks)

    def handle(self, ctx: Context, msg: Message) -> None:
        t = type(msg)
        if t is TaskTokens:
            self._tokens(ctx, msg)  # type: ignore[arg-type]
        elif t is TaskFinished:
            self._task_finished(ctx, msg)  # type: ignore[arg-type]
        elif t is TaskAccepted:
            self._acked(ctx, msg)  # type: ignore[arg-type]
        elif t is TaskRejected:
            self._rejected(ctx, msg)  # type: ignore[arg-type]
        elif t is JobRequest:
            self._submit(ctx, msg)  # type: ignore[arg-type]
        elif t is AcceptTimeout:
            self._timeout(ctx, msg)  # type: ignore[arg-type]
        elif t is OfferAgain:  # a waiting prefill task's TTFT deadline
            if msg.request_id in self.state.waiting:  # type: ignore[attr-defined]
                self._expire(ctx, msg.request_id)  # type: ignore[attr-defined]
        elif t is SweepTick:
            self._sweep(ctx)
        elif t is TeGroupMembership:
            self._membership(ctx, msg)  # type: ignore[arg-type]
        elif t is KVEventBatch:
            ctx.record(KvEventsFolded(te=ctx.sender, batch=msg))  # type: ignore[arg-type]
        elif t is SubmitBatch:
            self._batch(ctx, msg)  # type: ignore[arg-type]
        elif t is ParkTimeout:
            j = self.state.jobs.get(msg.request_id)  # type: ignore[attr-defined]
            if j is not None and msg.request_id in self.state.parked:  # type: ignore[attr-defined]
                self._finish(ctx, msg.request_id, j, "failed", f"no TE group for model {j.model!r} was pushed in time")  # type: ignore[attr-defined]
        elif t is BatchTick:
            self._pump_batch(ctx)
        elif t is CancelJob:
            self._cancel(ctx, msg)  # type: ignore[arg-type]
        elif t is CancelDeadline:
            j = self.state.jobs.get(msg.request_id)  # type: ignore[attr-defined]
            if j is not None:  # the TE never answered the cancel (dead, hung): end it here
                self._finish(ctx, msg.request_id, j, "cancelled", f"{j.cancelled} (no answer from {j.te or 'any TE'})")  # type: ignore[attr-defined]
        elif t is EndOfRun:
            for rid, j in list(self.state.jobs.items()):
                self._finish(ctx, rid, j, "failed", msg.reason)  # type: ignore[attr-defined]

    # ---- jobs in -------------------------------------------------------------------------------
    def _submit(self, ctx: Context, m: JobRequest) -> None:
        if m.request_id in self.state.jobs:
            ctx.record(JeLateMessage(task_id=m.request_id, what="duplicate JobRequest"))
            return
        arrival = m.arrival_s if m.arrival_s is not None else ctx.now()
        if len(self.state.jobs) >= MAX_JOBS:
            done = _done(m.request_id, "failed", f"JE holds {MAX_JOBS} jobs already", arrival, ctx.now())
            ctx.send(m.reply_to, done, corr=m.request_id)
            return
        match, longest = routing.group_walk(self.state, m.model, m.prompt.block_hashes)  # the decision's one walk
        bucket = m.predicted_bucket if m.predicted_bucket is not None else self._predict(m, longest)
        ctx.record(JobAccepted(request_id=m.request_id, model=m.model, prompt=m.prompt,
                               sampling=m.sampling, reply_to=m.reply_to, arrival_s=arrival,
                               predicted_bucket=bucket, stream=m.stream))  # fmt: skip
        self._dispatch(ctx, m.request_id, self.state.jobs[m.request_id], "chat", 1, match=match)

    def _predict(self, m: JobRequest, longest: int) -> int | None:
        """The decode-length bucket from what is known at arrival: the prompt length and the
        longest prefix any TE of the model holds (`longest`: from the global prompt tree's walk)."""
        if self._bucket is None:
            return None
        return self._bucket(m.prompt.num_tokens, longest)

    def _batch(self, ctx: Context, m: SubmitBatch) -> None:
        ids = {it.request_id for it in m.items}
        clash = len(ids) < len(m.items) or any(i in self.state.jobs for i in ids)
        if len(m.items) > MAX_BATCH_ITEMS or m.batch_id in self.state.batches or not m.items or clash:
            why = ("empty" if not m.items else "too large" if len(m.items) > MAX_BATCH_ITEMS
                   else "a request id is already in flight" if clash else "duplicate batch id")
            ctx.record(JeLateMessage(task_id=m.batch_id, what=f"batch refused: {why}"))
            ctx.send(m.reply_to, BatchDone(batch_id=m.batch_id, completed=0, failed=len(m.items)))
            return
        ctx.record(BatchAccepted(batch_id=m.batch_id, count=len(m.items), deadline_s=m.deadline_s,
                                 reply_to=m.reply_to))  # fmt: skip
        for it in m.items:
            ctx.record(JobAccepted(request_id=it.request_id, model=m.model, prompt=it.prompt,
                                   sampling=it.sampling, reply_to=m.reply_to, arrival_s=ctx.now(),
                                   batch_id=m.batch_id))  # fmt: skip
        self._pump_batch(ctx)

    def _pump_batch(self, ctx: Context) -> None:
        """Best effort behind online traffic: dispatch queued batch items while there is room."""
        s, cfg = self.state, self.cfg
        for rid in list(s.batch_queue):
            j = s.jobs[rid]
            deadline = s.batches[j.batch_id].deadline_s
            if ctx.now() >= deadline:
                self._finish(ctx, rid, j, "failed", f"batch deadline {deadline:g}s passed before dispatch")
        busy = sum(1 for j in s.jobs.values() if j.batch_id and not j.queued)
        while s.batch_queue and s.online < cfg.batch_online_limit and busy < cfg.batch_inflight:
            rid = s.batch_queue[0]
            self._dispatch(ctx, rid, s.jobs[rid], "chat", 1)
            busy += 1
        if s.batch_queue:
            ctx.after(cfg.batch_tick_s, BatchTick(), key="batch")

    # ---- routing -------------------------------------------------------------------------------
    def _candidates(self, j: Job, roles: tuple[str, ...], now: float = -1.0) -> tuple[Candidate, ...]:
        return routing.candidates(self.state, j, roles, now)[0]

    def decide(self, rid: str, j: Job, now: float, match: dict[str, int] | None = None) -> Decision | None:
        """The policy's choice for the job's chat-or-prefill task (None: no TE), with every TE it
        did not rank and why. Pure: `deepserve bench routing` times it."""
        # a prefill is of use only with a decode TE to take its KV: when every decode TE has
        # failed this job, its retry goes to a colocated TE
        s = self.state
        decodes = not j.excluded or routing.candidates(s, j, ("decode",))[0]
        roles = ("colocated", "prefill") if decodes else ("colocated",)
        pool, gone = routing.pool(s, j, roles, now, match)
        if not pool:
            return None
        d = self.policy.select_pool(self._route_req(rid, j), pool, s.turns)
        return msgspec.structs.replace(d, excluded=d.excluded + gone) if gone else d

    def _dispatch(self, ctx: Context, rid: str, j: Job, phase: str, attempt: int, last: str = "",
                  match: dict[str, int] | None = None) -> None:  # fmt: skip
        if j.cancelled:
            self._finish(ctx, rid, j, "cancelled", j.cancelled)
            return
        if phase == "decode":
            cands = self._candidates(j, ("decode",))
            decision = select_least_load(self._route_req(rid, j), cands) if cands else None
        elif phase == "prefill" and self.cfg.forwarding.mode == "on_demand" and j.refused:
            offered = self._offer(ctx, rid, j)
            if offered is None:
                return
            phase, decision = offered
        else:
            decision = self.decide(rid, j, ctx.now(), match)
            if decision is not None:
                phase = "prefill" if decision.subgroup == "pd" else "chat"
                if phase == "prefill" and self.cfg.forwarding.mode == "on_demand" and self.state.waiting:
                    why = f"{len(self.state.waiting)} prefill tasks wait before it"
                    ctx.record(RouteQueued(request_id=rid, decision=decision, reason=why))
                    self._wait(ctx, rid, j, why, front=j.waited)
                    return
        if decision is None and not last and j.model not in self.state.groups:
            if rid not in self.state.parked:
                ctx.record(JobParked(request_id=rid))
                ctx.after(self.cfg.forwarding.ttft_deadline_s, ParkTimeout(request_id=rid), key=f"park/{rid}")
            return
        if decision is None:
            self._finish(ctx, rid, j, "failed", self._no_te_why(j, phase, last))
            return
        self._send(ctx, rid, j, phase, attempt, decision)

    def _no_te_why(self, j: Job, phase: str, last: str) -> str:
        """Why no TE can take the job's next task, as it is: the group is empty, or every TE
        that could take it failed this job (named)."""
        if j.excluded:
            tail = f"; last: {last}" if last else ""
            return (f"no {phase} TE of model {j.model!r} left for it: {', '.join(j.excluded)} failed this "
                    f"job{tail}")  # fmt: skip
        return f"no TE for model {j.model!r} (its TE group is empty)"

    def _send(self, ctx: Context, rid: str, j: Job, phase: str, attempt: int, decision: Decision) -> None:
        tid = task_id(rid, phase, attempt)
        ctx.record(RouteDecided(request_id=rid, task_id=tid, phase=phase, attempt=attempt,  # type: ignore[arg-type]
                                decision=decision))  # fmt: skip
        ctx.send(decision.chosen, SubmitTask(
            task_id=tid, request_id=rid, kind=phase, model=j.model, prompt=j.prompt,  # type: ignore[arg-type]
            sampling=j.sampling, reply_to=ctx.self, arrival_s=j.arrival_s,
            kv_source=j.kv if phase == "decode" else None, stream_to=self.cfg.stream_to,
        ), corr=rid)  # fmt: skip
        ctx.after(self.cfg.forwarding.accept_timeout_s, AcceptTimeout(task_id=tid), key=f"acc/{tid}")

    def _offer(self, ctx: Context, rid: str, j: Job) -> tuple[str, Decision] | None:
        """On-demand forwarding: the next prefill after a refusal, or a wait, or the timeout;
        with no prefill able to take the task (each set aside or refused it for good), the
        colocated subgroup now rather than at the TTFT deadline."""
        now, fw, s = ctx.now(), self.cfg.forwarding, self.state
        cands, gone = routing.candidates(s, j, ("prefill",), now, fallback=False)
        if not cands:
            colo, cgone = routing.candidates(s, j, ("colocated",), now)
            if colo:
                d = self.policy.select(self._route_req(rid, j), colo, s.turns)
                why = f"no prefill TE can take it ({', '.join(t for e in gone for t in e.tes) or 'none in the group'})"
                return "chat", msgspec.structs.replace(d, reason=f"{why}: colocated subgroup; {d.reason}",
                                                       excluded=d.excluded + gone + cgone)  # fmt: skip
            cands, gone = routing.candidates(s, j, ("prefill",), now)  # the set-aside ones: a last resort
        offer = next_offer(cands, tuple(j.refused), now, j.arrival_s, fw)
        if offer.stop:
            self._finish(ctx, rid, j, "failed", f"timeout: {offer.stop}")
            return None
        if offer.te is None:
            self._wait(ctx, rid, j, "every prefill refused", front=j.waited, missed=j.waited)
            return None
        order = sorted((c for c in cands if c.te not in j.refused), key=lambda c: (c.load, c.te))
        refused = tuple(c.te for c in cands if c.te in j.refused)
        busy = (Excluded(tes=refused, subgroup="pd", reason="refused this sweep (busy)"),) if refused else ()
        why = (f"refused by {', '.join(j.refused)} this sweep: next fewest open streams" if j.refused else
               f"a new sweep (the last one refused by {', '.join(j.last_refused) or 'none'}): fewest open streams")
        return "prefill", Decision(policy="on_demand", params={"ttft_deadline_s": fw.ttft_deadline_s},
                                   chosen=offer.te, subgroup="pd", ranked=ranked(order), reason=why,
                                   order_by=("load",), excluded=busy + gone)  # fmt: skip

    # ---- on-demand forwarding: the JE-side wait, batch forwarding, bounded sweeps -------------
    def _wait(self, ctx: Context, rid: str, j: Job, reason: str, front: bool = False, missed: bool = False) -> None:
        """No prefill took the task: it waits here (oldest first) until a prefill's state
        changes (one accepts or finishes a task), a fallback sweep, or its TTFT deadline."""
        fw = self.cfg.forwarding
        if ctx.now() - j.arrival_s >= fw.ttft_deadline_s:
            self._finish(ctx, rid, j, "failed", f"timeout: TTFT deadline {fw.ttft_deadline_s:g}s passed; "
                         f"no prefill accepted ({reason})")  # fmt: skip
            return
        first = not j.waited
        ctx.record(PrefillWaiting(request_id=rid, reason=reason, front=front))
        if first:
            left = j.arrival_s + fw.ttft_deadline_s - ctx.now()
            ctx.after(left, OfferAgain(request_id=rid), key=f"offer/{rid}")
        if missed:
            ctx.record(SweepMissed())
        if front or len(self.state.waiting) == 1:
            delay = min(fw.retry_backoff_s * 2.0 ** min(self.state.sweep_misses, 30), fw.max_backoff_s)
            ctx.after(delay, SweepTick(), key="sweep")

    def _expire(self, ctx: Context, rid: str) -> None:
        j = self.state.jobs[rid]
        d = self.cfg.forwarding.ttft_deadline_s
        self._finish(ctx, rid, j, "failed", f"timeout: TTFT deadline {d:g}s passed while waiting; no prefill accepted")

    def _feed(self, ctx: Context, te: str) -> None:
        """P/D-Serve batch forwarding: `te` just took a task or freed a slot, so it is likely
        idle — offer it the oldest waiting prefill task now (its answer brings the next)."""
        s = self.state
        oldest = self._oldest_waiting(ctx)
        if oldest is None:
            return
        rid, j = oldest
        if te in j.excluded or te not in s.groups.get(j.model, {}).get("prefill", ()) \
                or s.set_aside.get(te, -1.0) > ctx.now():
            return
        tree = s.trees.get(j.model)  # the prefix it holds: the one TE's walk
        held = tree.match(j.prompt.block_hashes, [te])[te] if tree is not None else 0
        cand = Candidate(te=te, subgroup="pd", load=s.open.get(te, 0), prefix_blocks=held)
        decision = Decision(policy="batch_forwarding", params={}, chosen=te, subgroup="pd",
                            ranked=ranked([cand]), reason=f"{te} is taking work: the oldest of "
                            f"{len(s.waiting)} waiting prefill tasks, until it refuses")  # fmt: skip
        self._send(ctx, rid, j, "prefill", j.attempt + 1, decision)

    def _sweep(self, ctx: Context) -> None:
        """The fallback when no prefill state change was seen (another JE's task ended): offer
        the oldest waiting task around, fewest open streams first; backoff doubles per miss."""
        oldest = self._oldest_waiting(ctx)
        if oldest is None:
            return
        rid, j = oldest
        offered = self._offer(ctx, rid, j)
        if offered is not None:
            self._send(ctx, rid, j, offered[0], j.attempt + 1, offered[1])

    def _oldest_waiting(self, ctx: Context) -> tuple[str, Job] | None:
        """The oldest waiting prefill task still inside its TTFT deadline; the ones past it are
        failed on the way (recorded)."""
        s = self.state
        while s.waiting:
            rid = s.waiting[0]
            j = s.jobs[rid]
            if ctx.now() - j.arrival_s < self.cfg.forwarding.ttft_deadline_s:
                return rid, j
            self._expire(ctx, rid)
        return None

    def _route_req(self, rid: str, j: Job) -> RouteRequest:
        return RouteRequest(request_id=rid, prompt_tokens=j.prompt.num_tokens,
                            prompt_blocks=len(j.prompt.block_hashes), predicted_bucket=j.predicted_bucket)

    # ---- task answers --------------------------------------------------------------------------
    def _current(self, ctx: Context, tid: str, what: str) -> tuple[str, Job] | None:
        rid = tid.rpartition("/")[0]
        j = self.state.jobs.get(rid)
        if j is None or j.task_id != tid or not j.te:
            ctx.record(JeLateMessage(task_id=tid, what=what))
            return None
        return rid, j

    def _acked(self, ctx: Context, m: TaskAccepted) -> None:
        cur = self._current(ctx, m.task_id, "TaskAccepted")
        if cur is not None and not cur[1].acked:
            ctx.record(TaskAcked(task_id=m.task_id))
            ctx.cancel(f"acc/{m.task_id}")
            if cur[1].phase == "prefill" and self.cfg.forwarding.mode == "on_demand":
                self._feed(ctx, cur[1].te)  # it took one: offer it the next, until it refuses

    def _tokens(self, ctx: Context, m: TaskTokens) -> None:
        rid = m.task_id.rpartition("/")[0]
        j = self.state.jobs.get(rid)
        if j is None or j.task_id != m.task_id or not j.te:
            return  # an earlier attempt's or a finished job's tokens: never shown to the client
        first = m.times_s[0] if m.first_index == 0 and m.times_s else None
        ctx.record(TaskStreamed(task_id=m.task_id, upto=m.first_index + len(m.times_s), first_token_s=first))

    def _rejected(self, ctx: Context, m: TaskRejected) -> None:
        cur = self._current(ctx, m.task_id, "TaskRejected")
        if cur is None:
            return
        rid, j = cur
        ctx.cancel(f"acc/{m.task_id}")
        if j.phase == "prefill" and self.cfg.forwarding.mode == "on_demand":
            te, fed, busy = j.te, j.fed, is_busy(m.reason)
            ctx.record(OfferRefused(request_id=rid, task_id=m.task_id, te=te, reason=m.reason, permanent=not busy))
            if te_down(m.reason) and self.cfg.kv_fail_cooldown_s > 0:  # no other job offers it either
                ctx.record(PrefillSetAside(te=te, until_s=ctx.now() + self.cfg.kv_fail_cooldown_s,
                                           reason=f"refused {m.task_id}: {m.reason}"))  # fmt: skip
            if fed and busy:  # batch forwarding ends at the first refusal; the task is the oldest again
                self._wait(ctx, rid, j, f"{te} refused: it is busy", front=True)
            else:
                self._dispatch(ctx, rid, j, "prefill", j.attempt + 1)
            return
        self._task_failed(ctx, rid, j, f"rejected by {j.te}: {m.reason}")

    def _timeout(self, ctx: Context, m: AcceptTimeout) -> None:
        rid = m.task_id.rpartition("/")[0]
        j = self.state.jobs.get(rid)
        if j is None or j.task_id != m.task_id or not j.te or j.acked:
            return  # answered in time, or no longer current
        self._task_failed(ctx, rid, j, f"{j.te} did not answer within {self.cfg.forwarding.accept_timeout_s:g}s")

    def _task_finished(self, ctx: Context, m: TaskFinished) -> None:
        cur = self._current(ctx, m.task_id, f"TaskFinished {m.status}")
        if cur is None:
            return
        rid, j = cur
        ctx.cancel(f"acc/{m.task_id}")
        if j.cancelled:
            if m.kv is not None:  # a prefill that finished anyway: P may free the KV it holds
                ctx.send(m.kv.src, KvRelease(transfer_id=m.kv.transfer_id))
            status = "completed" if m.status == "completed" and j.phase != "prefill" else "cancelled"
            self._finish(ctx, rid, j, status, m.reason if status == "completed" else j.cancelled, m,
                         first=j.first_token_s if j.phase == "decode" else m.first_token_s,
                         cached=m.cached_prompt_tokens)  # fmt: skip
            return
        if m.status != "completed":
            self._task_failed(ctx, rid, j, f"{m.status} on {j.te}: {m.reason}")
            return
        if j.phase == "prefill" and m.kv is None and m.reason != "prefilled":
            # The prefill's first token was the whole answer (a 1-token target, EOS): no decode.
            self._finish(ctx, rid, j, "completed", m.reason, m, first=m.first_token_s, cached=m.cached_prompt_tokens)
            return
        if j.phase == "prefill":
            if m.kv is None:
                self._task_failed(ctx, rid, j, f"prefill on {j.te} finished without its KV handle")
                return
            te = j.te
            ctx.record(JeTaskEnded(request_id=rid, task_id=m.task_id, te=te, status="completed", reason=m.reason))
            ctx.record(JePrefilled(request_id=rid, first_token_s=m.first_token_s, kv=m.kv, te=te,
                                   cached_prompt_tokens=m.cached_prompt_tokens, prompt_tokens=m.prompt_tokens,
                                   queued_s=m.queued_s, scheduled_s=m.scheduled_s))  # fmt: skip
            self._dispatch(ctx, rid, j, "decode", j.decodes + 1)  # a restarted job's next decode
            if self.cfg.forwarding.mode == "on_demand":
                self._feed(ctx, te)  # a prefill slot freed: the prefill's state changed
            return
        pd = j.phase == "decode"
        self._finish(ctx, rid, j, "completed", m.reason, m,
                     first=j.first_token_s if pd else m.first_token_s,
                     cached=j.cached_prompt_tokens if pd else m.cached_prompt_tokens)  # fmt: skip

    def _task_failed(self, ctx: Context, rid: str, j: Job, reason: str) -> None:
        te, phase, attempt = j.te, j.phase, j.attempt
        kv_lost = phase == "decode" and KV_TRANSFER_FAILED in reason
        ctx.record(JeTaskEnded(request_id=rid, task_id=j.task_id, te=te, status="failed", reason=reason,
                               prefill_te=j.prefill_te if kv_lost else ""))  # fmt: skip
        cooldown = self.cfg.kv_fail_cooldown_s
        if kv_lost and j.prefill_te and cooldown > 0:
            ctx.record(PrefillSetAside(te=j.prefill_te, until_s=ctx.now() + cooldown, reason=reason))
        if j.cancelled:
            self._finish(ctx, rid, j, "cancelled", j.cancelled)
            return
        if j.stream and (j.streamed or phase == "decode"):  # the client has seen output
            # "chat" is the colocated task's kind, whatever the API: a completion's said "chat task"
            what = "generation (prefill and decode)" if phase == "chat" else phase
            self._finish(ctx, rid, j, "failed", f"its {what} task failed after output streamed: {reason}")
            return
        # Nothing reached the client (a non-streaming one sees output only at the end): retry. A
        # failed decode starts over from a new prefill (its KV went with the decode); the tokens
        # already produced are discarded (RouteDecided resets them, the frontend drops them).
        restart = phase == "decode"
        tries = j.start_attempt if restart else attempt
        if tries >= self.cfg.max_attempts:
            self._finish(ctx, rid, j, "failed", f"gave up after {tries} attempt{'s' if tries > 1 else ''}: {reason}")
        else:
            self._dispatch(ctx, rid, j, "chat" if restart else phase, tries + 1, reason)

    # ---- membership and ends -------------------------------------------------------------------
    def _cancel(self, ctx: Context, m: CancelJob) -> None:
        failover.cancel(self, ctx, m)

    def _membership(self, ctx: Context, m: TeGroupMembership) -> None:
        failover.membership(self, ctx, m)

    def _finish(self, ctx: Context, rid: str, j: Job, status: str, reason: str,
                m: TaskFinished | None = None, first: float | None = None, cached: int = 0) -> None:
        if status == "cancelled" and j.cancel_completes:
            status = "completed"  # cut short by a stop sequence: the client has its whole output
        if j.te:
            ctx.cancel(f"acc/{j.task_id}")
        if j.cancelled:
            ctx.cancel(f"cancel/{rid}")
        timed = j if j.phase == "decode" else m  # PD: the prefill's times (JePrefilled), as its first token
        done = RequestDone(
            request_id=rid, status=status, reason=reason, arrival_s=j.arrival_s,  # type: ignore[arg-type]
            first_token_s=first if m is not None else j.first_token_s, finish_s=ctx.now() if m is None else m.finish_s,
            # Ended by the JE (no task result): what the client was sent
            prompt_tokens=m.prompt_tokens if m is not None else (j.prompt_tokens or j.prompt.num_tokens),
            cached_prompt_tokens=cached, output_tokens=m.output_tokens if m is not None else j.output_tokens,
            # a job its TE failed has left that TE (`excluded`): name it all the same
            te=(m.te or j.te) if m is not None else (j.te or (j.excluded[-1] if j.excluded else "")),
            preemptions=m.preemptions if m is not None else 0,
            queued_s=timed.queued_s if timed is not None else None,
            scheduled_s=timed.scheduled_s if timed is not None else None,
        )  # fmt: skip
        batch = j.batch_id
        b = self.state.batches.get(batch) if batch else None
        ctx.record(JobFinished(done=done, batch_id=batch))  # evolve counts it into `b` in place
        ctx.send(j.reply_to, done, corr=rid)
        if b is not None and batch not in self.state.batches:  # that was the batch's last item
            ctx.send(j.reply_to, BatchDone(batch_id=batch, completed=b.completed, failed=b.failed))
        if not batch and self.state.batch_queue:
            self._pump_batch(ctx)


def _done(rid: str, status: str, reason: str, arrival: float, now: float) -> RequestDone:
    return RequestDone(request_id=rid, status=status, reason=reason, arrival_s=arrival,  # type: ignore[arg-type]
                       first_token_s=None, finish_s=now, prompt_tokens=0, cached_prompt_tokens=0,
                       output_tokens=0, te="")
