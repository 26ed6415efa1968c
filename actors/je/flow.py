"""The JE's decision core, first half: jobs in (online and batch), each task routed and sent, on-demand
forwarding's wait, batch forwarding and sweeps, and a job's one terminal record.

Every method takes the JE's state `s`, the delivery's time `now` and an `Effects` port `fx`, and
no context: what it decides goes out as effects (effects.py). The decisions themselves are the
pure functions of `decide.py`; these methods put them in order, reading the state each recorded
event has just changed (`evolve` works in place, so `s` stays current through a delivery).
"""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.distflow.migrate import KvImport
from deepserve.actors.flowserve.messages import SubmitTask, TaskFinished
from deepserve.actors.scheduling import Decision, Policy
from deepserve.actors.scheduling.predictor import DecodeLengthTree, bucket_memo
from deepserve.actors.workload.messages import RequestStatus

from . import decide as D
from . import routing
from .config import MAX_JOBS, JeConfig
from .effects import Effects
from .messages import (
    AcceptTimeout,
    BatchAccepted,
    BatchDone,
    BatchTick,
    JeLateMessage,
    JeState,
    Job,
    JobAccepted,
    JobFinished,
    JobParked,
    JobRequest,
    OfferAgain,
    ParkTimeout,
    Phase,
    PrefillWaiting,
    RouteDecided,
    RouteQueued,
    SubmitBatch,
    SweepMissed,
    SweepTick,
)
from .migration import KvImportSent, KvImportTimeout, offer_of


class JobFlow:
    """The JE's configuration and policy, and the job-level half of its protocol."""

    def __init__(self, cfg: JeConfig) -> None:
        self.cfg = cfg
        self.policy = Policy(cfg.policy, cfg.params, cfg.heatmap)
        p = cfg.predictor
        self.predictor = msgspec.convert(p, DecodeLengthTree) if p is not None else None
        self._bucket = bucket_memo(self.predictor, cfg.kv_block_tokens) if self.predictor else None
        self.me = ""  # the JE's address (the TEs' reply_to): set by the actor before each input
        self.on_demand = cfg.forwarding.mode == "on_demand"

    def predict(self, m: JobRequest, longest: int) -> int | None:
        """The decode-length bucket from what is known at arrival: the prompt length and the
        longest prefix any TE of the model holds (`longest`: from the global prompt tree's walk)."""
        if self._bucket is None:
            return None
        return self._bucket(m.prompt.num_tokens, longest)

    # ---- jobs in -------------------------------------------------------------------------------
    def job_request(self, s: JeState, now: float, fx: Effects, m: JobRequest) -> None:
        if m.request_id in s.jobs:
            fx.record(JeLateMessage(task_id=m.request_id, what="duplicate JobRequest"))
            return
        arrival = m.arrival_s if m.arrival_s is not None else now
        if len(s.jobs) >= MAX_JOBS:
            done = D.refused_at_once(m.request_id, f"JE holds {MAX_JOBS} jobs already", arrival, now)
            fx.send(m.reply_to, done, corr=m.request_id)
            return
        match, longest = routing.group_walk(s, m.model, m.prompt.block_hashes)  # the decision's one walk
        bucket = m.predicted_bucket if m.predicted_bucket is not None else self.predict(m, longest)
        fx.record(JobAccepted(request_id=m.request_id, model=m.model, prompt=m.prompt, sampling=m.sampling,
                              reply_to=m.reply_to, arrival_s=arrival, predicted_bucket=bucket, stream=m.stream,
                              epoch=m.epoch))  # fmt: skip
        self.start(s, now, fx, m, s.jobs[m.request_id], match)

    def start(self, s: JeState, now: float, fx: Effects, m: JobRequest, j: Job, match: dict[str, int]) -> None:
        """A new job's first task (JeCore: a job moved here from a lost JE resumes its stream)."""
        self.dispatch(s, now, fx, m.request_id, j, "chat", 1, match=match)

    def batch(self, s: JeState, now: float, fx: Effects, m: SubmitBatch) -> None:
        why = D.batch_refusal(s, m)
        if why:
            fx.record(JeLateMessage(task_id=m.batch_id, what=f"batch refused: {why}"))
            fx.send(m.reply_to, BatchDone(batch_id=m.batch_id, completed=0, failed=len(m.items)))
            return
        fx.record(BatchAccepted(batch_id=m.batch_id, count=len(m.items), deadline_s=m.deadline_s, reply_to=m.reply_to))
        for it in m.items:
            fx.record(JobAccepted(request_id=it.request_id, model=m.model, prompt=it.prompt, sampling=it.sampling,
                                  reply_to=m.reply_to, arrival_s=now, batch_id=m.batch_id))  # fmt: skip
        self.pump_batch(s, now, fx)

    def pump_batch(self, s: JeState, now: float, fx: Effects) -> None:
        """Best effort behind online traffic: dispatch queued batch items while there is room."""
        cfg = self.cfg
        for rid in list(s.batch_queue):
            j = s.jobs[rid]
            deadline = s.batches[j.batch_id].deadline_s
            if now >= deadline:
                self.finish(s, now, fx, rid, j, "failed", f"batch deadline {deadline:g}s passed before dispatch")
        busy = sum(1 for j in s.jobs.values() if j.batch_id and not j.queued)
        while s.batch_queue and s.online < cfg.batch_online_limit and busy < cfg.batch_inflight:
            rid = s.batch_queue[0]
            self.dispatch(s, now, fx, rid, s.jobs[rid], "chat", 1)
            busy += 1
        if s.batch_queue:
            fx.after(cfg.batch_tick_s, BatchTick(), key="batch")

    # ---- routing -------------------------------------------------------------------------------
    def dispatch(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, phase: Phase, attempt: int,
                 last: str = "", match: dict[str, int] | None = None) -> None:  # fmt: skip
        """Route the job's next task and send it — or queue it behind waiting prefill tasks, park
        it until its model's group is known, or end the job when no TE can take it."""
        if j.cancelled:
            self.finish(s, now, fx, rid, j, "cancelled", j.cancelled)
            return
        decision: Decision | None
        if phase == "decode":
            decision = D.decide_decode(s, rid, j)
        elif phase == "prefill" and self.on_demand and j.refused:
            offered = D.offer(s, self.policy, self.cfg.forwarding, rid, j, now)
            if isinstance(offered, D.OfferStop):
                self.finish(s, now, fx, rid, j, "failed", offered.reason)
                return
            if isinstance(offered, D.OfferWait):
                self.wait(s, now, fx, rid, j, "every prefill refused", front=j.waited, missed=j.waited)
                return
            phase, decision = offered.phase, offered.decision
        else:
            decision = D.decide(s, self.policy, rid, j, now, match)
            if decision is not None:
                phase = "prefill" if decision.subgroup == "pd" else "chat"
                if phase == "prefill" and self.on_demand and s.waiting:
                    why = f"{len(s.waiting)} prefill tasks wait before it"
                    fx.record(RouteQueued(request_id=rid, decision=decision, reason=why))
                    self.wait(s, now, fx, rid, j, why, front=j.waited)
                    return
        # a model never heard of, or (`park_empty`: scale to zero, a restarting world) with no TE in
        # the groups that could take this task (a decode: decode; else colocated or prefill): the
        # job waits for a TE (parked, until its TTFT deadline) instead of failing at once
        groups = s.groups.get(j.model)
        takers = ("decode",) if phase == "decode" else ("colocated", "prefill")
        empty = groups is None or (self.cfg.park_empty and not any(groups.get(k) for k in takers))
        if decision is None and not last and empty:
            if rid not in s.parked:
                fx.record(JobParked(request_id=rid))
                fx.after(self.cfg.forwarding.ttft_deadline_s, ParkTimeout(request_id=rid), key=f"park/{rid}")
            return
        if decision is None:
            self.finish(s, now, fx, rid, j, "failed", D.no_te_why(j, phase, last))
            return
        self.send_task(s, fx, rid, j, phase, attempt, decision)

    def send_task(self, s: JeState, fx: Effects, rid: str, j: Job, phase: Phase, attempt: int,
                  decision: Decision) -> None:  # fmt: skip
        tid = D.task_id(rid, phase, attempt, j.epoch)
        if j.kv_move is not None and phase != "decode":  # a moved request's KV is pulled there first
            self.kv_import(s, fx, rid, j, phase, attempt, decision, tid)
            return
        if self.cfg.forced and (te := self.cfg.forced.get(tid)) is not None and te != decision.chosen:
            decision = msgspec.structs.replace(decision, chosen=te, reason=(
                f"what-if: {te} forced instead of the policy's {decision.chosen} ({decision.reason})"))
        fx.record(RouteDecided(request_id=rid, task_id=tid, phase=phase, attempt=attempt, decision=decision))
        te = decision.chosen  # a single-DP TE's master directly (TaskAcked.direct): its shell only forwards
        dst = s.direct.get(te, te)
        fx.send(dst, SubmitTask(
            task_id=tid, request_id=rid, kind=phase, model=j.model, prompt=j.prompt, sampling=j.sampling,
            reply_to=self.me, arrival_s=j.arrival_s, kv_source=j.kv if phase == "decode" else None,
            # a non-streaming client sees nothing before the end: the JE needs no chunk of its
            # tasks (a failed one is retried from scratch whatever it produced)
            stream_to=self.cfg.stream_to, tokens=j.stream, resume_from=j.resume_from,
        ), corr=rid)  # fmt: skip
        if not (self.cfg.quiet_accept and phase == "chat" and dst != te):  # no TaskAccepted will come
            fx.after(self.cfg.forwarding.accept_timeout_s, AcceptTimeout(task_id=tid), key=f"acc/{tid}")

    def kv_import(self, s: JeState, fx: Effects, rid: str, j: Job, phase: Phase, attempt: int, decision: Decision,
                  tid: str) -> None:  # fmt: skip
        """KV migration (migration.py): the routed task waits while its target pulls the blocks
        that survived on the failed TE's host (distflow/migrate.py); `JeCore.kv_imported` sends it."""
        c = j.kv_move
        assert c is not None
        te = decision.chosen
        fx.record(KvImportSent(request_id=rid, task_id=tid, phase=phase, attempt=attempt, decision=decision,
                               blocks=c.survived_blocks))  # fmt: skip
        p = self.cfg.migration
        fx.send(s.direct.get(te, te), KvImport(request_id=rid, task_id=tid, hashes=j.prompt.block_hashes[:c.survived_blocks],
                                               offer=offer_of(rid, c), reply_to=self.me, timeout_s=p.import_timeout_s), corr=rid)  # fmt: skip
        fx.after(p.import_timeout_s + p.survey_s, KvImportTimeout(request_id=rid, task_id=tid), key=f"import/{rid}")

    # ---- on-demand forwarding: the JE-side wait, batch forwarding, bounded sweeps -------------
    def wait(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, reason: str,
             front: bool = False, missed: bool = False) -> None:  # fmt: skip
        """No prefill took the task: it waits here (oldest first) until a prefill's state
        changes (one accepts or finishes a task), a fallback sweep, or its TTFT deadline."""
        fw = self.cfg.forwarding
        if now - j.arrival_s >= fw.ttft_deadline_s:
            self.finish(s, now, fx, rid, j, "failed", f"timeout: TTFT deadline {fw.ttft_deadline_s:g}s passed; "
                        f"no prefill accepted ({reason})")  # fmt: skip
            return
        first = not j.waited
        fx.record(PrefillWaiting(request_id=rid, reason=reason, front=front))
        if first:
            fx.after(j.arrival_s + fw.ttft_deadline_s - now, OfferAgain(request_id=rid), key=f"offer/{rid}")
        if missed:
            fx.record(SweepMissed())
        if front or len(s.waiting) == 1:
            fx.after(D.sweep_delay_s(fw, s.sweep_misses), SweepTick(), key="sweep")

    def expire(self, s: JeState, now: float, fx: Effects, rid: str) -> None:
        d = self.cfg.forwarding.ttft_deadline_s
        why = f"timeout: TTFT deadline {d:g}s passed while waiting; no prefill accepted"
        self.finish(s, now, fx, rid, s.jobs[rid], "failed", why)

    def feed(self, s: JeState, now: float, fx: Effects, te: str) -> None:
        """P/D-Serve batch forwarding: `te` just took a task or freed a slot, so it is likely
        idle — offer it the oldest waiting prefill task now (its answer brings the next)."""
        oldest = self.oldest_waiting(s, now, fx)
        if oldest is None:
            return
        rid, j = oldest
        decision = D.feed(s, j, te, now)
        if decision is not None:
            self.send_task(s, fx, rid, j, "prefill", j.attempt + 1, decision)

    def sweep(self, s: JeState, now: float, fx: Effects) -> None:
        """The fallback when no prefill state change was seen (another JE's task ended): offer
        the oldest waiting task around, fewest open streams first; backoff doubles per miss."""
        oldest = self.oldest_waiting(s, now, fx)
        if oldest is None:
            return
        rid, j = oldest
        offered = D.offer(s, self.policy, self.cfg.forwarding, rid, j, now)
        if isinstance(offered, D.OfferStop):
            self.finish(s, now, fx, rid, j, "failed", offered.reason)
        elif isinstance(offered, D.OfferWait):
            self.wait(s, now, fx, rid, j, "every prefill refused", front=j.waited, missed=j.waited)
        else:
            self.send_task(s, fx, rid, j, offered.phase, j.attempt + 1, offered.decision)

    def oldest_waiting(self, s: JeState, now: float, fx: Effects) -> tuple[str, Job] | None:
        """The oldest waiting prefill task still inside its TTFT deadline; the ones past it are
        failed on the way (recorded)."""
        while s.waiting:
            rid = s.waiting[0]
            j = s.jobs[rid]
            if now - j.arrival_s < self.cfg.forwarding.ttft_deadline_s:
                return rid, j
            self.expire(s, now, fx, rid)
        return None

    # ---- the end -------------------------------------------------------------------------------
    def finish(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, status: RequestStatus, reason: str,
               m: TaskFinished | None = None, first: float | None = None, cached: int = 0) -> None:  # fmt: skip
        """The job's one terminal record, and the client's `RequestDone` (a batch's last item:
        its `BatchDone` too); an online job's end may make room for queued batch items."""
        if status == "cancelled" and j.cancel_completes:
            status = "completed"  # cut short by a stop sequence: the client has its whole output
        if j.te:
            fx.cancel(f"acc/{j.task_id}")
        if j.cancelled:
            fx.cancel(f"cancel/{rid}")
        done = D.request_done(rid, j, status, reason, now, m, first, cached)
        batch = j.batch_id
        b = s.batches.get(batch) if batch else None
        fx.record(JobFinished(done=done, batch_id=batch))  # evolve counts it into `b` in place
        fx.send(j.reply_to, done, corr=rid)
        if b is not None and batch not in s.batches:  # that was the batch's last item
            fx.send(j.reply_to, BatchDone(batch_id=batch, completed=b.completed, failed=b.failed))
        if not batch and s.batch_queue:
            self.pump_batch(s, now, fx)
