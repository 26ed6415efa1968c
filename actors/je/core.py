"""The JE's decision core: `JeCore.handle(s, now, msg, fx)` is everything the JobExecutor does
with one input, as effects (effects.py) — no context, no I/O, so it runs and is tested without a
driver (tests/actors/je/test_je_core.py). This half: the TEs' answers about tasks (accepted,
tokens, rejected, silent, finished), a failed task retried or its job ended, the cluster
manager's membership pushes (a TE that left its group has its open tasks failed over; draining
TEs keep theirs), cancels from the frontend, and the JE's own timers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepserve.actors.flowserve.distflow.migrate import (
    KvExportAsk,
    KvExportOffer,
    KvExportRelease,
    KvImported,
)
from deepserve.actors.flowserve.master.kv_publish import QuietAccepts, SubscribeKvEvents
from deepserve.actors.flowserve.master.pd import KvRelease
from deepserve.actors.flowserve.messages import (
    KV_TRANSFER_FAILED,
    CancelTask,
    TaskAccepted,
    TaskFinished,
    TaskRejected,
    TaskTokens,
)
from deepserve.actors.flowserve.rtc.kv_events import KVEventBatch
from deepserve.actors.scheduling.forwarding import is_busy, te_down
from deepserve.actors.workload.messages import EndOfRun
from deepserve.core import Message

from . import decide as D
from . import migration as M
from . import routing
from .effects import Effects
from .flow import JobFlow
from .messages import (
    AcceptTimeout,
    BatchTick,
    CancelDeadline,
    CancelJob,
    JeLateMessage,
    JePrefilled,
    JeState,
    JeTaskEnded,
    Job,
    JobCancelRequested,
    JobRequest,
    MembershipChanged,
    OfferAgain,
    OfferRefused,
    ParkTimeout,
    PrefillSetAside,
    SubmitBatch,
    SweepTick,
    TaskAcked,
    TaskStreamed,
    TeGroupMembership,
)
from .trees import KvEventsFolded


class JeCore(JobFlow):
    def handle(self, s: JeState, now: float, fx: Effects, msg: Message) -> None:
        """One input, carried out through `fx`. Unknown inputs are ignored (as before)."""
        on = _ON.get(type(msg))
        if on is not None:
            on(self, s, now, fx, msg)

    def kv_batch(self, fx: Effects, sender: str, m: KVEventBatch) -> None:
        """A TE's KV cache events, folded into the model's prompt tree (trees.py)."""
        fx.record(KvEventsFolded(te=sender, batch=m))

    # ---- task answers --------------------------------------------------------------------------
    def current(self, s: JeState, fx: Effects, tid: str, what: str) -> tuple[str, Job] | None:
        """The job whose current task `tid` is, or None (recorded as late: an earlier attempt's
        answer, or a finished job's)."""
        rid = tid.rpartition("/")[0]
        j = s.jobs.get(rid)
        if j is None or j.task_id != tid or not j.te:
            fx.record(JeLateMessage(task_id=tid, what=what))
            return None
        return rid, j

    def acked(self, s: JeState, now: float, fx: Effects, m: TaskAccepted) -> None:
        cur = self.current(s, fx, m.task_id, "TaskAccepted")
        if cur is not None and not cur[1].acked:
            te = cur[1].te
            direct = m.master if m.solo and s.direct.get(te) != m.master else ""
            fx.record(TaskAcked(task_id=m.task_id, direct=direct))
            fx.cancel(f"acc/{m.task_id}")
            if cur[1].phase == "prefill" and self.on_demand:
                self.feed(s, now, fx, cur[1].te)  # it took one: offer it the next, until it refuses

    def tokens(self, s: JeState, now: float, fx: Effects, m: TaskTokens) -> None:
        j = s.jobs.get(m.task_id.rpartition("/")[0])
        if j is None or j.task_id != m.task_id or not j.te:
            return  # an earlier attempt's or a finished job's tokens: never shown to the client
        first = m.times_s[0] if m.first_index == 0 and m.times_s else None
        fx.record(TaskStreamed(task_id=m.task_id, upto=m.first_index + len(m.times_s), first_token_s=first))

    def rejected(self, s: JeState, now: float, fx: Effects, m: TaskRejected) -> None:
        cur = self.current(s, fx, m.task_id, "TaskRejected")
        if cur is None:
            return
        rid, j = cur
        fx.cancel(f"acc/{m.task_id}")
        # A refusal re-offers the prefill (on-demand forwarding) only while nothing came out of it:
        # after output it is the task's failure, and the retry rule decides (a streaming client
        # never sees its request restarted)
        if not (j.phase == "prefill" and self.on_demand) or j.streamed:
            self.task_failed(s, now, fx, rid, j, f"rejected by {j.te}: {m.reason}")
            return
        # on-demand forwarding: a refusal is not a failure — the next prefill is asked
        te, fed, busy = j.te, j.fed, is_busy(m.reason)
        fx.record(OfferRefused(request_id=rid, task_id=m.task_id, te=te, reason=m.reason, permanent=not busy))
        if te_down(m.reason) and self.cfg.kv_fail_cooldown_s > 0:  # no other job offers it either
            fx.record(PrefillSetAside(te=te, until_s=now + self.cfg.kv_fail_cooldown_s,
                                      reason=f"refused {m.task_id}: {m.reason}"))  # fmt: skip
        if fed and busy:  # batch forwarding ends at the first refusal; the task is the oldest again
            self.wait(s, now, fx, rid, j, f"{te} refused: it is busy", front=True)
        else:
            self.dispatch(s, now, fx, rid, j, "prefill", j.attempt + 1)

    def accept_timeout(self, s: JeState, now: float, fx: Effects, m: AcceptTimeout) -> None:
        rid = m.task_id.rpartition("/")[0]
        j = s.jobs.get(rid)
        if j is None or j.task_id != m.task_id or not j.te or j.acked:
            return  # answered in time, or no longer current
        self.task_failed(s, now, fx, rid, j, f"{j.te} did not answer within {self.cfg.forwarding.accept_timeout_s:g}s")

    def task_finished(self, s: JeState, now: float, fx: Effects, m: TaskFinished) -> None:
        cur = self.current(s, fx, m.task_id, f"TaskFinished {m.status}")
        if cur is None:
            return
        rid, j = cur
        fx.cancel(f"acc/{m.task_id}")
        if j.cancelled and m.kv is not None:  # a prefill that finished anyway: P may free the KV it holds
            fx.send(m.kv.src, KvRelease(transfer_id=m.kv.transfer_id))
        result = D.task_result(j, m)
        if isinstance(result, D.Finish):
            self.finish(s, now, fx, rid, j, result.status, result.reason, m, result.first_token_s,
                        result.cached_prompt_tokens)  # fmt: skip
        elif isinstance(result, D.Failed):
            self.task_failed(s, now, fx, rid, j, result.reason)
        else:
            self.prefilled(s, now, fx, rid, j, m)

    def prefilled(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, m: TaskFinished) -> None:
        """The prefill's KV is ready: its decode task goes to a decode TE."""
        assert m.kv is not None  # task_result: a prefill finished with its KV handle
        te = j.te
        fx.record(JeTaskEnded(request_id=rid, task_id=m.task_id, te=te, status="completed", reason=m.reason))
        fx.record(JePrefilled(request_id=rid, first_token_s=m.first_token_s, kv=m.kv, te=te,
                              cached_prompt_tokens=m.cached_prompt_tokens, prompt_tokens=m.prompt_tokens,
                              queued_s=m.queued_s, scheduled_s=m.scheduled_s))  # fmt: skip
        # named after its prefill's attempt (a restarted job's next decode at least), so the
        # frontend's merge (stream.task_order) orders it after that prefill — after a refused or
        # retried prefill too, whose first token the client already has
        self.dispatch(s, now, fx, rid, j, "decode", max(j.decodes + 1, j.start_attempt))
        if self.on_demand:
            self.feed(s, now, fx, te)  # a prefill slot freed: the prefill's state changed

    def task_failed(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, reason: str) -> None:
        """The job's current task failed (or was given up on): recorded, then retried on another
        TE or the job ended (`decide.after_failure`)."""
        te, phase, attempt = j.te, j.phase, j.attempt
        kv_lost = phase == "decode" and KV_TRANSFER_FAILED in reason
        fx.record(JeTaskEnded(request_id=rid, task_id=j.task_id, te=te, status="failed", reason=reason,
                              prefill_te=j.prefill_te if kv_lost else ""))  # fmt: skip
        cooldown = self.cfg.kv_fail_cooldown_s
        if kv_lost and j.prefill_te and cooldown > 0:
            fx.record(PrefillSetAside(te=j.prefill_te, until_s=now + cooldown, reason=reason))
        if j.switch is not None:  # live migration: its successor is on its way (kv_imported sends it)
            return
        if D.moves(j, phase, self.cfg.migration):
            self.migrate(s, now, fx, rid, j, te, reason)
            return
        if phase == "decode" and j.kv is not None and self.cfg.release_lost_decode_kv:
            fx.send(j.kv.src, KvRelease(transfer_id=j.kv.transfer_id), corr=rid)  # zombie protection
        verdict = D.after_failure(j, phase, attempt, reason, self.cfg.max_attempts)
        if isinstance(verdict, D.End):
            self.finish(s, now, fx, rid, j, verdict.status, verdict.reason)
        else:
            self.dispatch(s, now, fx, rid, j, verdict.phase, verdict.attempt, verdict.last)

    def start(self, s: JeState, now: float, fx: Effects, m: JobRequest, j: Job, match: dict[str, int]) -> None:
        """Zombie protection (P/D-Serve §3.4), the JE's half: a streamed job the gateway moved
        here from a lost JE is a migration with no TE to cancel — it resumes at the client's
        position (asked of the frontend when so configured; else from token 0, the frontend
        dropping what its client has)."""
        if m.epoch and m.stream and self.cfg.migration.enabled:
            self.migrate(s, now, fx, m.request_id, j, "", m.lost or "its JE was lost")
        else:
            super().start(s, now, fx, m, j, match)

    def migrate(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, te: str, reason: str) -> None:
        """Request migration (xLLM §3.5): the streamed request continues on another TE from the
        output token its client has — asked of the live frontend first when so configured."""
        ask, to = self.cfg.migration.ask_stream_s, self.cfg.stream_to
        if ask > 0 and to:
            fx.record(M.MigrationAsked(request_id=rid, task_id=j.task_id, from_te=te, failure=reason))
            fx.send(to, M.StreamPositionAsk(request_id=rid, reply_to=self.me), corr=rid)
            fx.after(ask, M.AskTimeout(request_id=rid, task_id=j.task_id), key=f"ask/{rid}")
            return
        self.move(s, now, fx, rid, j, te, reason, j.output_tokens, "")

    def position(self, s: JeState, now: float, fx: Effects, m: M.StreamPosition) -> None:
        j = s.jobs.get(m.request_id)
        if j is not None and j.asked is not None:
            fx.cancel(f"ask/{m.request_id}")
            a = j.asked
            self.move(s, now, fx, m.request_id, j, a.from_te, a.failure, m.next_index, "the frontend's position")

    def ask_timeout(self, s: JeState, now: float, fx: Effects, m: M.AskTimeout) -> None:
        j = s.jobs.get(m.request_id)
        if j is not None and j.asked is not None and j.asked.task_id == m.task_id:
            a = j.asked
            self.move(s, now, fx, m.request_id, j, a.from_te, a.failure, j.output_tokens,
                      "no answer from the frontend: the chunks the JE saw")  # fmt: skip

    def move(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, te: str, reason: str, client: int,
             basis: str, live: bool = False) -> None:  # fmt: skip
        """The request's next task resumes at output token `client`, its KV rebuilt the cheaper
        way (migration.py); zombie protection for what the failed task leaves behind."""
        resume = min(client, j.sampling.max_tokens - 1)
        p = self.cfg.migration
        if p.kv and te:  # KV migration: first ask the failed TE what its host still holds
            fx.record(M.KvSurveyStarted(request_id=rid, task_id=j.task_id, from_te=te, resume_from=resume,
                                        failure=reason, basis=basis, live=live))  # fmt: skip
            fx.send(te, KvExportAsk(request_id=rid, hashes=j.prompt.block_hashes, reply_to=self.me, live=live), corr=rid)
            fx.after(p.survey_s, M.KvSurveyTimeout(request_id=rid, task_id=j.task_id), key=f"survey/{rid}")
            return
        choice = M.choose(p, j.prompt.num_tokens, resume, self.cached_tokens(s, j), "")
        self.moved(s, now, fx, rid, j, te, reason, resume, basis, choice)

    def cached_tokens(self, s: JeState, j: Job, lost: str = "") -> int:
        """The prompt tokens the best TE of the job's group caches (the JE's prompt tree) — with
        `lost`, that failed TE's cache (still in the tree) and those the job failed on left out."""
        match, longest = routing.group_walk(s, j.model, j.prompt.block_hashes)
        if lost:
            longest = max((n for te, n in match.items() if te != lost and te not in j.excluded), default=0)
        return longest * self.cfg.kv_block_tokens

    def kv_offered(self, s: JeState, now: float, fx: Effects, m: KvExportOffer | M.KvSurveyTimeout) -> None:
        """The failed TE's answer (its first DP group to answer; the others are late), or none in
        time: migrate or recompute, priced (migration.choose_kv)."""
        j = s.jobs.get(m.request_id)
        sv = j.surveying if j is not None else None
        if j is None or sv is None or (isinstance(m, M.KvSurveyTimeout) and m.task_id != sv.task_id):
            return
        fx.cancel(f"survey/{m.request_id}")
        offer = m if isinstance(m, KvExportOffer) else None
        choice = M.choose_kv(self.cfg.migration, j.prompt.num_tokens, sv.resume_from, self.cached_tokens(s, j, sv.from_te),
                             sv.from_te, offer, self.cfg.kv_block_tokens)  # fmt: skip
        if offer is not None and choice.mode == "recompute":  # the pinned run will not be pulled
            fx.send(offer.master, KvExportRelease(request_id=m.request_id), corr=m.request_id)
        self.moved(s, now, fx, m.request_id, j, sv.from_te, sv.failure, sv.resume_from, sv.basis, choice)

    def kv_imported(self, s: JeState, now: float, fx: Effects, m: KvImported | M.KvImportTimeout) -> None:
        """The target has the surviving blocks (or could not get them): the held task goes."""
        j = s.jobs.get(m.request_id)
        imp = j.importing if j is not None else None
        if j is None or imp is None or m.task_id != imp.task_id:
            return
        fx.cancel(f"import/{m.request_id}")
        sw = j.switch  # (KvImportEnded clears it)
        if isinstance(m, KvImported):
            fx.record(M.KvImportEnded(request_id=m.request_id, task_id=m.task_id, ok=m.ok, te=m.te, blocks=m.blocks,
                                      nbytes=m.nbytes, duration_s=m.duration_s, reason=m.reason))  # fmt: skip
        else:
            why = f"no answer within {self.cfg.migration.import_timeout_s:g}s: the task recomputes"
            fx.record(M.KvImportEnded(request_id=m.request_id, task_id=m.task_id, ok=False, reason=why))
        self.send_task(s, fx, m.request_id, j, imp.phase, imp.attempt, imp.decision)  # type: ignore[arg-type]
        if sw is not None:  # live migration: the old task stops once its successor is on its way
            fx.send(sw.from_te, CancelTask(task_id=sw.task_id, reason=f"migrated: {sw.failure}"), corr=m.request_id)

    def moved(self, s: JeState, now: float, fx: Effects, rid: str, j: Job, te: str, reason: str, resume: int,
              basis: str, choice: M.Choice) -> None:  # fmt: skip
        """The move, chosen: recorded, the failed task's remains cleaned up, the next task sent."""
        old, kv = j.task_id, j.kv if j.phase == "decode" else None
        fx.record(M.TaskMigrated(request_id=rid, task_id=old, from_te=te, resume_from=resume,
                                 failure=reason, choice=choice, basis=basis))  # fmt: skip
        # Zombie protection (P/D-Serve §3.4): a failed TE that is not dead (hung, cut off) stops
        # the old task and frees its blocks; a decode's prefill side frees the KV it holds for it
        # now, not when its hold expires. (A dead TE's address drops the cancel.)
        if te and j.switch is None:  # live migration: at the switch (kv_imported)
            fx.send(te, CancelTask(task_id=old, reason=f"migrated: {reason}"), corr=rid)
        if kv is not None:
            fx.send(kv.src, KvRelease(transfer_id=kv.transfer_id), corr=rid)
        attempt = (j.start_attempt if j.phase == "decode" else j.attempt) + 1
        self.dispatch(s, now, fx, rid, j, "chat", attempt, reason)

    # ---- membership, cancels, timers -----------------------------------------------------------
    def membership(self, s: JeState, now: float, fx: Effects, m: TeGroupMembership) -> None:
        known = s.groups.get(m.model, {}).get(m.role, [])
        was = list(s.draining.get(f"{m.model}/{m.role}", ()))
        fx.record(MembershipChanged(model=m.model, role=m.role, tes=m.tes, draining=m.draining))
        if self.cfg.kv_events and m.role != "decode":  # the prompt tree mirrors the TEs' caches
            for te in m.tes:
                if te not in known:  # new, or a replacement at the same address: its cache is empty
                    fx.send(te, SubscribeKvEvents(subscriber=self.me))
        if self.cfg.quiet_accept and m.role != "decode":  # before any task to it (the same path)
            for te in m.tes:
                if te not in known:
                    fx.send(te, QuietAccepts(requester=self.me))
        members = {te for tes in s.groups.get(m.model, {}).values() for te in tes}
        prefix = f"{m.model}/"
        members |= {te for k, tes in s.draining.items() if k.startswith(prefix) for te in tes}
        for rid in [r for r in s.parked if s.jobs[r].model == m.model]:
            fx.cancel(f"park/{rid}")
            self.dispatch(s, now, fx, rid, s.jobs[rid], "chat", 1)
        for rid, j in list(s.jobs.items()):
            if j.model == m.model and j.te and j.te not in members:
                self.task_failed(s, now, fx, rid, j, f"{j.te} left the {m.role} group")
        if self.cfg.migration.live and self.cfg.migration.kv:
            self.drain_live(s, now, fx, m, set(s.draining.get(f"{m.model}/{m.role}", ())) - set(was))
        if m.role == "prefill" and self.on_demand:
            for te in m.tes:
                if te not in known:
                    self.feed(s, now, fx, te)  # a new prefill is idle

    def drain_live(self, s: JeState, now: float, fx: Effects, m: TeGroupMembership, started: set[str]) -> None:
        """Live migration: the streams on TEs that just started draining move now, their KV read
        from the working HBM, instead of holding the TE until they finish."""
        p = self.cfg.migration
        for rid, j in list(s.jobs.items()):
            # (a prefill is left to finish: its answer would start a decode beside the moved task)
            if (j.te in started and j.model == m.model and j.stream and not j.cancelled and j.phase != "prefill"
                    and j.surveying is None and j.importing is None and j.migrations < p.max_migrations):  # fmt: skip
                self.move(s, now, fx, rid, j, j.te, f"live migration: {j.te} is draining", j.output_tokens, "", live=True)

    def cancel(self, s: JeState, now: float, fx: Effects, m: CancelJob) -> None:
        """A cancel from the frontend: to the TE holding the job's task (which frees its KV);
        ended here if that TE never answers (`cancel_deadline`)."""
        j = s.jobs.get(m.request_id)
        if j is None or j.cancelled:
            return  # not this JE's job (cancels go to every JE), or cancelled already
        fx.record(JobCancelRequested(request_id=m.request_id, reason=m.reason, completed=m.completed))
        if not j.te:  # parked, queued, or between tasks: nothing runs
            self.finish(s, now, fx, m.request_id, j, "cancelled", m.reason)
            return
        fx.send(j.te, CancelTask(task_id=j.task_id, reason=m.reason), corr=m.request_id)
        fx.after(self.cfg.forwarding.accept_timeout_s, CancelDeadline(request_id=m.request_id),
                 key=f"cancel/{m.request_id}")  # fmt: skip

    def cancel_deadline(self, s: JeState, now: float, fx: Effects, m: CancelDeadline) -> None:
        j = s.jobs.get(m.request_id)
        if j is not None:  # the TE never answered the cancel (dead, hung): end it here
            self.finish(s, now, fx, m.request_id, j, "cancelled", f"{j.cancelled} (no answer from {j.te or 'any TE'})")

    def offer_again(self, s: JeState, now: float, fx: Effects, m: OfferAgain) -> None:
        if m.request_id in s.waiting:  # a waiting prefill task's TTFT deadline
            self.expire(s, now, fx, m.request_id)

    def park_timeout(self, s: JeState, now: float, fx: Effects, m: ParkTimeout) -> None:
        j = s.jobs.get(m.request_id)
        if j is not None and m.request_id in s.parked:
            self.finish(s, now, fx, m.request_id, j, "failed", f"no TE group for model {j.model!r} was pushed in time")

    def end_of_run(self, s: JeState, now: float, fx: Effects, m: EndOfRun) -> None:
        for rid, j in list(s.jobs.items()):
            self.finish(s, now, fx, rid, j, "failed", m.reason)


def _sweep(core: JeCore, s: JeState, now: float, fx: Effects, m: SweepTick) -> None:
    core.sweep(s, now, fx)


def _batch_tick(core: JeCore, s: JeState, now: float, fx: Effects, m: BatchTick) -> None:
    core.pump_batch(s, now, fx)


# The input kinds, each to its method (one look-up); a method takes exactly its key's type.
_ON: dict[type, Callable[[JeCore, JeState, float, Effects, Any], None]] = {
    TaskTokens: JeCore.tokens, TaskFinished: JeCore.task_finished, TaskAccepted: JeCore.acked,
    TaskRejected: JeCore.rejected, JobRequest: JeCore.job_request, AcceptTimeout: JeCore.accept_timeout,
    OfferAgain: JeCore.offer_again, SweepTick: _sweep, TeGroupMembership: JeCore.membership,
    SubmitBatch: JeCore.batch, ParkTimeout: JeCore.park_timeout, BatchTick: _batch_tick,
    CancelJob: JeCore.cancel, CancelDeadline: JeCore.cancel_deadline, EndOfRun: JeCore.end_of_run,
    M.StreamPosition: JeCore.position, M.AskTimeout: JeCore.ask_timeout,
    KvExportOffer: JeCore.kv_offered, M.KvSurveyTimeout: JeCore.kv_offered, KvImported: JeCore.kv_imported,
    M.KvImportTimeout: JeCore.kv_imported,
}  # fmt: skip
