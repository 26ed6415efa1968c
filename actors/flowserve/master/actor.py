"""The DP-group master actor: FlowServe's scheduler loop for one DP group, driven only through
the NPU port (`NpuForward`/`NpuForwardDone`, or `NpuForwardRun` on the simulation fast path).

Loop: a batch is planned when the previous one ends (or on arrival when idle) and handed to the
NPU at once, to start after the launch gap (`start_delay_s`, timed by the device) — with
asynchronous execution the host's scheduling work overlaps the running forward, so only
`sched_gap_s` separates two passes. When the batch ends, its
tokens go straight to each task's `reply_to` (output short-circuiting) — or, for the tasks with a
`stream_to` (a live frontend), as one `TokenBatch` a pass there, the requester told of the first
chunk only — finished tasks end, and the next batch is planned. With `aggregate`, a pure-decode batch runs k passes as one NPU request; an
arrival (or anything else that may change the batch) truncates the run after its current pass, so
the per-token times equal the stepwise path's.

Beside it, by concept: admission.py (whether a task is accepted), launch.py (a run's shapes),
copies.py (the tier copies, a mixin), failures.py (how tasks fail, a mixin).
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from deepserve.actors.cluster.liveness import answer_heartbeat
from deepserve.actors.cluster.messages import DpHeartbeat
from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.distflow import migrate
from deepserve.actors.flowserve.master import context, pd, recovery
from deepserve.actors.flowserve.master.admission import admission_problem
from deepserve.actors.flowserve.master.copies import COPY, TierCopies
from deepserve.actors.flowserve.master.evolve import evolve_master
from deepserve.actors.flowserve.master.failures import TaskFailures
from deepserve.actors.flowserve.master.kv_publish import (
    AcceptsQuieted,
    KvPublisher,
    KvSubscribed,
    QuietAccepts,
    SubscribeKvEvents,
)
from deepserve.actors.flowserve.master.launch import _lead_s, _lead_shapes
from deepserve.actors.flowserve.master.messages import (
    DpMatch,
    DpMatchQuery,
    DpStatus,
    DpStatusQuery,
)
from deepserve.actors.flowserve.master.output import finished_message, token_message
from deepserve.actors.flowserve.master.prefetch import should_populate
from deepserve.actors.flowserve.master.scheduler import has_head, schedule
from deepserve.actors.flowserve.master.state import (
    LOADING,
    WAITING,
    BatchEnded,
    BatchInterrupted,
    DeviceLost,
    InFlight,
    MasterConfig,
    MasterState,
    Req,
    TaskCancelMarked,
    TaskEnded,
    TaskQueued,
    new_state,
)
from deepserve.actors.flowserve.master.status import dp_load
from deepserve.actors.flowserve.messages import (
    CancelOwner,
    CancelTask,
    CreateContext,
    DeleteContext,
    GetContext,
    SubmitTask,
    TaskAccepted,
    TaskRejected,
    TaskTokens,
    TokenBatch,
)
from deepserve.actors.flowserve.sampling import output_length_of
from deepserve.actors.ports.link import LinkTransferDone, LinkTransferFailed
from deepserve.actors.ports.npu import (
    CRASHED,
    HBM_FAULT,
    NpuError,
    NpuForward,
    NpuForwardDone,
    NpuForwardRun,
    NpuForwardRunDone,
    NpuForwardTruncate,
    SeqShape,
)
from deepserve.core import Actor, AskFailed, Context, Event, Message

# Tuples: isinstance on a union (X | Y) is slower
_FORWARD_DONE = (NpuForwardRunDone, NpuForwardDone)
_LINK_DONE = (LinkTransferDone, LinkTransferFailed)

# Device errors after which every forward fails until a reset (the NPU port's kinds).
DEVICE_LOST = (CRASHED, HBM_FAULT)


class DpMaster(TierCopies, TaskFailures, Actor[MasterState]):
    """One DP group's master. `config` is a `MasterConfig` (or its dict form)."""

    # The state embeds the whole block pool: a snapshot deep-copies it, so take them rarely.
    snapshot_every: ClassVar[int] = 8192
    # The state changes only in `evolve` (handlers read it and record events), so a snapshot
    # copies the live state instead of folding its 8,192 events a second time: on the whole
    # Mooncake trace the masters' snapshots took 1.9 s of ~29 s folded, 0.08 s copied. Each
    # snapshot equals the fold in tests/actors/flowserve/test_snapshot_from_live.py.
    snapshot_from_live: ClassVar[bool] = True

    def __init__(self, config: Any) -> None:
        self.cfg = config if isinstance(config, MasterConfig) else msgspec.convert(config, MasterConfig)
        self.npu = self.cfg.npus[0]
        self.kv = KvPublisher(self.cfg.block_tokens, self.cfg.dp, self.cfg.kv_ride)  # KV events to subscribers
        # The batch in flight and whether it has a head (`has_head`): computed at its launch,
        # read again when it ends (its entries' progress does not change in between). Not
        # state: a restarted actor computes it again.
        self._head: tuple[InFlight | None, bool] = (None, False)
        self._gap = self.cfg.launch_gap_s()  # the config is frozen: read once a batch otherwise

    def initial_state(self) -> MasterState:
        return new_state(self.cfg)

    def evolve(self, state: MasterState, event: Event) -> MasterState:
        if type(event) is KvSubscribed or type(event) is AcceptsQuieted:
            self.kv.evolve(event)  # type: ignore[arg-type]
            return state
        return evolve_master(state, event)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, _FORWARD_DONE):
            self._done(ctx, msg)
        elif isinstance(msg, SubmitTask):
            self._submit(ctx, msg)
        elif isinstance(msg, _LINK_DONE) and msg.req_id.startswith(COPY):
            self._copy_done(ctx, msg)
        elif isinstance(msg, CancelTask):
            self._cancel(ctx, msg)
        elif isinstance(msg, CancelOwner):  # its JE is gone: each of its tasks, as if cancelled
            for tid in [t for t, r in self.state.reqs.items() if r.task.reply_to == msg.owner]:
                self._cancel(ctx, CancelTask(task_id=tid, reason=msg.reason))
        elif isinstance(msg, NpuError) and recovery.handles(self, msg):  # recompute, mask (off by default)
            recovery.on_error(self, ctx, msg)
        elif isinstance(msg, NpuError):
            reason = f"{msg.device}: {msg.kind}: {msg.reason}"
            if msg.kind in DEVICE_LOST and not self.state.device_lost:
                ctx.record(DeviceLost(reason=reason))  # first: `advance` then plans nothing
            fl = self.state.in_flight
            if fl is not None and msg.req_id == f"fwd:{fl.step}":
                self._device_failed(ctx, reason)
            if self.state.device_lost:
                self._fail_on_lost_device(ctx)
        elif isinstance(msg, AskFailed) and msg.target == self.npu:
            self._device_failed(ctx, f"{msg.target}: no answer ({msg.reason})")
        elif isinstance(msg, DpMatchQuery):
            hits = tuple(len(rtc.match_by_prefix(self.state.rtc, p).hbm_blocks) for p in msg.prompts)
            ctx.reply(DpMatch(req_id=msg.req_id, hit_blocks=hits, load=dp_load(self.state, self.cfg)))
        elif isinstance(msg, CreateContext | GetContext | DeleteContext):
            context.handle(self, ctx, msg)
        elif isinstance(msg, DpStatusQuery):
            load = dp_load(self.state, self.cfg)
            status = DpStatus(req_id=msg.req_id, load=load, max_num_seqs=self.cfg.max_num_seqs,
                              block_tokens=self.cfg.block_tokens)  # fmt: skip
            ctx.send(ctx.sender, status)
        elif pd.handles(msg):
            pd.handle(self, ctx, msg)
        elif migrate.handles(msg):  # KV migration from a failed TE's host DRAM (distflow/migrate.py)
            migrate.handle(self, ctx, msg)
        elif type(msg) is SubscribeKvEvents:
            self.kv.subscribe(ctx, msg)  # type: ignore[arg-type]
        elif type(msg) is QuietAccepts:
            self.kv.quieten(ctx, msg)  # type: ignore[arg-type]
        elif isinstance(msg, DpHeartbeat):  # xDeepServe §6.1: answered only while the loop moves
            answer_heartbeat(self, ctx, msg)
        elif type(msg) is recovery.RollbackIteration:
            recovery.on_rollback(self, ctx, msg)  # type: ignore[arg-type]
        if self.kv.subscribers:
            self.kv.flush(ctx)  # this delivery's KV cache events, one batch per subscriber

    # ---- arrivals ---------------------------------------------------------------------
    def _submit(self, ctx: Context, msg: SubmitTask) -> None:
        st, cfg = self.state, self.cfg
        reason = self.check(msg)
        if reason is not None:
            ctx.send(msg.reply_to, TaskRejected(task_id=msg.task_id, reason=reason))
            return
        s = msg.sampling
        out_len, stop = output_length_of(s, cfg.eos_rate, cfg.eos_lognormal)
        if msg.stream and (not self.kv.quiet or self.kv.acknowledges(ctx, msg.kind, msg.reply_to)):
            accepted = TaskAccepted(task_id=msg.task_id, te=cfg.te, dp=cfg.dp, master=ctx.self, solo=cfg.solo)
            ctx.send(msg.reply_to, accepted)
        if msg.kind == "decode":
            pd.submit_decode(self, ctx, msg, out_len, stop)
            return
        if msg.kind == "prefill" and out_len > msg.resume_from + 1:  # a resumed one: token `resume_from`
            out_len, stop = msg.resume_from + 1, "prefilled"
        if msg.resume_from >= out_len > 0:  # a migrated stream whose output was all out already
            ctx.record(TaskQueued(task=msg, out_len=out_len, stop=stop, emitted=out_len, at_s=ctx.now()))
            self.end(ctx, self.state.reqs[msg.task_id], "completed", stop)
            return
        hashes = msg.prompt.block_hashes
        m = rtc.match_by_prefix(st.rtc, hashes) if cfg.dram_blocks else rtc.NO_MATCH
        load = m.dram_blocks and should_populate(
            len(m.dram_blocks), cfg.block_tokens, cfg.kv_block_bytes, cfg.populate_bytes_per_s,
            st.prefill_tokens_per_s,
        ) and rtc.can_allocate(st.rtc, len(m.dram_blocks), m.hbm_blocks)  # fmt: skip
        status = LOADING if load else WAITING
        ctx.record(TaskQueued(task=msg, out_len=out_len, stop=stop, status=status, emitted=msg.resume_from,
                              at_s=ctx.now()))  # fmt: skip
        if load:
            copy = rtc.populate(st.rtc, msg.task_id, hashes, m)
            assert copy is not None
            ctx.record(copy)
            self._move(ctx, copy)
        self.advance(ctx)

    def check(self, msg: SubmitTask) -> str | None:
        """Why the task cannot be accepted (naming the field), or None (admission.py)."""
        return admission_problem(self.state, self.cfg, msg)

    def _cancel(self, ctx: Context, msg: CancelTask) -> None:
        r = self.state.reqs.get(msg.task_id)
        if r is None or r.cancelled is not None:
            return  # finished already: its one terminal message is on its way
        fl = self.state.in_flight
        busy = fl is not None and any(e.task_id == msg.task_id for e in fl.entries)
        if busy or r.status in (LOADING, pd.RECEIVING):
            ctx.record(TaskCancelMarked(task_id=msg.task_id, reason=msg.reason, at_s=ctx.now()))
            self.advance(ctx)
        else:
            self.end(ctx, r, "cancelled", msg.reason)

    # ---- the loop -----------------------------------------------------------------------
    def advance(self, ctx: Context, interrupt: bool = True) -> None:
        """Plan the next batch when none is in flight; otherwise (unless `interrupt` is False:
        nothing that changed can alter the next plan) make a run end after its current pass,
        so whatever just changed is seen at the next pass boundary."""
        st = self.state
        if st.device_lost:
            return  # nothing runs on a lost device
        if st.deferred:
            pd.try_receive(self, ctx)  # blocks may have been freed: deferred receives first
        fl = st.in_flight
        if fl is not None:
            if interrupt and fl.iterations > 1 and not fl.interrupt:
                ctx.record(BatchInterrupted(step=fl.step))
                if fl.launched:
                    ctx.send(self.npu, NpuForwardTruncate(req_id=f"fwd:{fl.step}"))
            return
        plan = schedule(st, self.cfg, ctx.record, launch=True)
        for copy in plan.copies:
            self._move(ctx, copy)
        batch = plan.batch
        if batch is None:
            return
        if batch.admitted:  # the admitted tasks' first scheduling time (vLLM's SCHEDULED)
            batch = msgspec.structs.replace(batch, at_s=ctx.now())
        ctx.record(batch)  # launched (`_launch` below) when it has entries
        if not batch.entries:  # only preemptions: a task larger than the pool alone
            self._fail_unfit(ctx, batch.preempted)
            return
        self._launch(ctx)


    def _launch(self, ctx: Context) -> None:
        """Hand the batch just planned to the NPU at once, asking it to start after the launch
        gap (`start_delay_s`): the device times the gap, so no timer of ours is needed. Whatever
        arrives during the gap truncates a run to its first pass, as it would have been planned."""
        st, cfg = self.state, self.cfg
        fl = st.in_flight
        assert fl is not None
        iterations = fl.iterations
        reqs = st.reqs
        seqs = tuple([SeqShape(e.n, reqs[e.task_id].num_computed) for e in fl.entries])
        req_id = f"fwd:{fl.step}"
        gap = self._gap
        if iterations == 1:
            fwd: NpuForward | NpuForwardRun = NpuForward(
                req_id=req_id, model=cfg.model, seqs=seqs, tp=cfg.tp, sample=True, start_delay_s=gap
            )
        elif self._has_head(fl):  # pass 0 (and the lead's) finish prompts; then all decode
            lead, after = _lead_shapes(seqs, fl)
            fwd = NpuForwardRun(req_id=req_id, model=cfg.model, seqs=after, head=seqs, lead=lead,
                                tp=cfg.tp, sample=True, iterations=iterations, gap_s=gap,
                                start_delay_s=gap, starts=False)  # fmt: skip
        else:
            fwd = NpuForwardRun(req_id=req_id, model=cfg.model, seqs=seqs, tp=cfg.tp, sample=True,
                                iterations=iterations, gap_s=gap, start_delay_s=gap,
                                starts=False)  # fmt: skip
        # The timeout follows the run's expected length (runs are capped to a share of it).
        ctx.ask(self.npu, fwd, cfg.npu_timeout_s + gap + iterations * st.run_pass_s)

    def _done(self, ctx: Context, msg: NpuForwardDone | NpuForwardRunDone) -> None:
        fl = self.state.in_flight
        if fl is None or msg.req_id != f"fwd:{fl.step}":
            return  # a late answer to a batch already failed
        if isinstance(msg, NpuForwardRunDone):
            # Pass 0 of a run with a head is a prefill: its duration samples the prefill rate.
            head_s = msg.first_pass_s if self._has_head(fl) else 0.0
            lead_s = _lead_s(msg.ends_s, fl, self._gap) if fl.lead else ()
            self._finish_batch(ctx, msg.ends_s, head_s, lead_s)
        else:
            prefill_s = 0.0
            for e in fl.entries:  # the pass held a prefill chunk: its duration samples the rate
                if e.n > 1:
                    prefill_s = msg.duration_s
                    break
            self._finish_batch(ctx, (ctx.now(),), prefill_s)

    def _has_head(self, fl: InFlight) -> bool:
        known, head = self._head
        if known is not fl:
            head = has_head(self.state, fl.entries)
            self._head = (fl, head)
        return head

    def _finish_batch(self, ctx: Context, ends_s: tuple[float, ...], prefill_s: float,
                      lead_s: tuple[float, ...] = ()) -> None:  # fmt: skip
        st, cfg = self.state, self.cfg
        fl = st.in_flight
        assert fl is not None
        reqs = st.reqs
        before: list[tuple[str, int]] = []  # each entry's tokens emitted before this batch
        for e in fl.entries:
            r = reqs.get(e.task_id)
            if r is not None:
                before.append((e.task_id, r.emitted))
        ctx.record(BatchEnded(step=fl.step, ends_s=ends_s, prefill_s=prefill_s, lead_s=lead_s))
        B, seqs = cfg.block_tokens, st.rtc.seqs
        chunks = self._chunks(ctx, fl, before, ends_s)
        for tid, first in before:
            r = reqs.get(tid)
            if r is None:
                continue
            task = r.task
            chunk = chunks.get(tid)
            # the short-circuit (`stream_to`, sent above): the requester hears of the first only
            head = task.resume_from + (task.kind == "decode")  # the task's first output token
            if chunk is not None and task.tokens and (not task.stream_to or first == head):
                ctx.send(task.reply_to, chunk, corr=task.request_id)
            prompt = task.prompt
            c, p = r.num_computed, prompt.num_tokens
            full = (c if c < p else p) // B  # prompt blocks computed (min, without the call)
            sb = seqs.get(tid)
            if sb is not None and full > sb.num_cached:  # newly computed prompt blocks
                ev = rtc.cache_blocks(st.rtc, tid, prompt.block_hashes, full)
                if ev is not None:
                    ctx.record(ev)
                    if cfg.kv_backup:  # write-through to host DRAM (distflow/migrate.py)
                        migrate.backup(self, ctx, ev)
            if r.cancelled is not None:
                self.end(ctx, r, "cancelled", r.cancelled)
            elif r.emitted >= r.out_len:
                if r.stop == "prefilled":
                    pd.hold(self, ctx, r)
                elif r.stop == context.CONTEXT:
                    context.created(self, ctx, r)
                else:
                    self.end(ctx, r, "completed", r.stop)
        self._background_copies(ctx)
        self.advance(ctx)

    def _chunks(self, ctx: Context, fl: InFlight, before: list[tuple[str, int]],
                ends_s: tuple[float, ...]) -> dict[str, TaskTokens]:  # fmt: skip
        """The pass's output chunk of each streaming task that produced tokens. Those of tasks
        with `stream_to` (the output short-circuit) leave at once as one `TokenBatch` per
        address — one message and one log record a pass, ahead of any task's end."""
        reqs, cfg = self.state.reqs, self.cfg
        out: dict[str, TaskTokens] = {}
        direct: dict[str, list[TaskTokens]] | None = None
        emit_from: dict[str, int] | None = None
        for tid, first in before:
            r = reqs.get(tid)
            if r is None:
                continue
            got = r.emitted - first
            task = r.task
            if not got or not task.stream or not (task.tokens or task.stream_to):
                continue
            if emit_from is None:  # once a batch, and only when a token is streamed
                emit_from = fl.first_emits()
            f = emit_from.get(tid, 0)
            times = ends_s[f : f + got] if len(ends_s) > 1 else ends_s * got
            chunk = out[tid] = token_message(r, first, times, cfg)
            if r.task.stream_to:
                direct = direct if direct is not None else {}
                direct.setdefault(r.task.stream_to, []).append(chunk)
        for dst, cs in (direct or {}).items():
            ctx.send(dst, TokenBatch(chunks=tuple(cs)))
        return out


    def end(self, ctx: Context, r: Req, status: str, reason: str) -> None:
        """The task's one terminal state: release its blocks, record it, tell the requester."""
        tid = r.task.task_id
        if tid in self.state.rtc.seqs:
            ctx.record(rtc.free(self.state.rtc, tid))
        src = r.task.kv_source
        if src is not None and r.status in (pd.ARRIVED, pd.DEFERRED):  # never pulled: P may free
            ctx.send(src.src, pd.KvRelease(transfer_id=src.transfer_id))
        msg = finished_message(r, status, reason, ctx.now(), self.cfg)
        ctx.record(TaskEnded(task_id=tid, status=status, reason=reason))
        ctx.send(r.task.reply_to, msg, corr=r.task.request_id)


