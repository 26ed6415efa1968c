"""The TE shell (DeepServe §4.1, xDeepServe §4.2–4.3): one per Task Executor.

It spawns the TE's DP-group masters as children (`{te}/dp/{i}`), registers the TE with the
cluster manager (when its address is configured), reports health and load periodically, serves
the context-caching endpoints, and dispatches each task to a DP group — once per task; tokens
then flow from the DP master straight to the requester (output short-circuiting).

Dispatch with several groups is a gather round (the collaborative leader's all-gather): pending
tasks wait while every group answers `DpMatch` (its load and each prompt's HBM prefix hits), then
`balancer.assign` places them all at once. Tasks arriving during a round wait for the next one.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from deepserve.actors.cluster.messages import Heartbeat
from deepserve.actors.flowserve.balancer import Pending, assign
from deepserve.actors.flowserve.distflow.messages import CorruptKvBlock
from deepserve.actors.flowserve.distflow.migrate import KvExportAsk, KvImport
from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.master.kv_publish import QuietAccepts, SubscribeKvEvents
from deepserve.actors.flowserve.master.messages import (
    DpMatch,
    DpMatchQuery,
    DpStatus,
    DpStatusQuery,
)
from deepserve.actors.flowserve.master.state import MasterConfig, spawn_config
from deepserve.actors.flowserve.messages import (
    CancelOwner,
    CancelTask,
    ContextInfo,
    CreateContext,
    DeleteContext,
    DpLoad,
    GetContext,
    RegisterTe,
    SubmitTask,
    TaskRejected,
    TeLoadReport,
)
from deepserve.core import Actor, AskFailed, Context, Event, Message

MAX_PENDING = 100_000  # a limit on everything: tasks waiting for a dispatch round


class TeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    te: str  # the TE's name (its address)
    role: Literal["colocated", "prefill", "decode"] = "colocated"
    dps: tuple[MasterConfig, ...]
    balancer: Literal["collaborative", "round_robin"] = "collaborative"
    cluster_manager: str | None = None
    report_interval_s: float = 1.0
    ask_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.dps:
            raise ValueError("TeConfig.dps: a TE has at least one DP group")
        if self.report_interval_s <= 0:
            raise ValueError(f"TeConfig.report_interval_s: must be > 0, got {self.report_interval_s}")


class ShellState(msgspec.Struct, kw_only=True):
    pending: list[SubmitTask] = []
    round: int = 0  # id of the gather round in flight (0: none)
    round_tasks: int = 0
    rounds: int = 0
    # str keys: the kernel encodes records with sorted keys, which msgspec allows for str only
    answers: dict[str, DpMatch | None] = {}  # str(dp) -> its answer (None: it did not answer)
    rr_next: int = 0
    contexts: dict[str, int] = {}  # context id -> DP group holding it
    dispatched: list[int] = []  # tasks sent to each group
    report: dict[str, DpLoad | None] = {}  # str(dp) -> its load, for the report being gathered
    reporting: bool = False


class TaskPending(Event, frozen=True):
    task: SubmitTask


class RoundStarted(Event, frozen=True):
    round: int
    tasks: int  # the first `tasks` pending tasks are this round's (later ones wait)


class RoundAnswer(Event, frozen=True):
    dp: int
    answer: DpMatch | None


class RoundAssigned(Event, frozen=True):
    """The round's tasks went to `groups[i]` (-1: rejected, no group answered)."""

    groups: tuple[int, ...]


class ContextPlaced(Event, frozen=True):
    context_id: str
    dp: int


class ContextDropped(Event, frozen=True):
    context_id: str


class ReportStarted(Event, frozen=True):
    pass


class ReportAnswer(Event, frozen=True):
    dp: int
    load: DpLoad | None


class ReportSent(Event, frozen=True):
    pass


class ReportTick(Message, frozen=True):
    pass


def _evolve(st: ShellState, e: Event) -> ShellState:
    if isinstance(e, TaskPending):
        st.pending.append(e.task)
    elif isinstance(e, RoundStarted):
        st.round, st.rounds, st.answers, st.round_tasks = e.round, e.round, {}, e.tasks
    elif isinstance(e, RoundAnswer):
        st.answers[str(e.dp)] = e.answer
    elif isinstance(e, RoundAssigned):
        n = len(e.groups)
        for g in e.groups:
            if g >= 0:
                st.dispatched[g] += 1
        st.pending = st.pending[n:]
        st.round, st.answers = 0, {}
        st.rr_next = (st.rr_next + n) % max(len(st.dispatched), 1)
    elif isinstance(e, ContextPlaced):
        st.contexts[e.context_id] = e.dp
    elif isinstance(e, ContextDropped):
        st.contexts.pop(e.context_id, None)
    elif isinstance(e, ReportStarted):
        st.reporting, st.report = True, {}
    elif isinstance(e, ReportAnswer):
        st.report[str(e.dp)] = e.load
    elif isinstance(e, ReportSent):
        st.reporting, st.report = False, {}
    else:
        raise AssertionError(f"te shell: unknown event {type(e).__name__}")
    return st


class TeShell(Actor[ShellState]):
    def __init__(self, config: Any) -> None:
        self.cfg = config if isinstance(config, TeConfig) else msgspec.convert(config, TeConfig)
        self.dp_addrs = tuple(f"{self.cfg.te}/dp/{i}" for i in range(len(self.cfg.dps)))

    def initial_state(self) -> ShellState:
        return ShellState(dispatched=[0] * len(self.cfg.dps))

    def evolve(self, state: ShellState, event: Event) -> ShellState:
        return _evolve(state, event)

    def on_start(self, ctx: Context) -> None:
        cfg = self.cfg
        for addr, dp in zip(self.dp_addrs, cfg.dps, strict=True):
            ctx.spawn(addr, DpMaster, config={**spawn_config(dp), "solo": len(cfg.dps) == 1})
        if cfg.cluster_manager:
            npus = tuple(n for dp in cfg.dps for n in dp.npus)
            ctx.send(cfg.cluster_manager, RegisterTe(te=cfg.te, model=cfg.dps[0].model, role=cfg.role,
                                                     dp_groups=len(cfg.dps), npus=npus))  # fmt: skip
            ctx.after(cfg.report_interval_s, ReportTick(), key="report")

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, SubmitTask):
            self._submit(ctx, msg)
        elif isinstance(msg, DpMatch):
            self._answer(ctx, msg.req_id, msg)
        elif isinstance(msg, AskFailed) and msg.target in self.dp_addrs:
            self._ask_failed(ctx, msg)
        elif isinstance(msg, CancelTask | CancelOwner | CorruptKvBlock | SubscribeKvEvents | QuietAccepts):
            for addr in self.dp_addrs:  # the group that has it acts; the others ignore it
                ctx.send(addr, msg)
        elif isinstance(msg, KvExportAsk):  # KV migration: every group answers for its own DRAM tier
            for addr in self.dp_addrs:
                ctx.send(addr, msg)
        elif isinstance(msg, KvImport):  # into group 0: its prefix hit steers the task's dispatch there
            ctx.send(self.dp_addrs[0], msg)
        elif isinstance(msg, CreateContext | GetContext | DeleteContext):
            self._context(ctx, msg)
        elif isinstance(msg, ReportTick):
            self._report_tick(ctx)
        elif isinstance(msg, DpStatus):
            self._report_answer(ctx, int(msg.req_id.rpartition(":")[2]), msg.load)
        elif isinstance(msg, Heartbeat):  # xDeepServe §6.1: fanned out to the DP masters by {te}/hb
            ctx.send(f"{self.cfg.te}/hb", msg)

    # ---- dispatch ---------------------------------------------------------------------
    def _submit(self, ctx: Context, msg: SubmitTask) -> None:
        st = self.state
        if msg.context_id is not None and msg.context_id in st.contexts:
            ctx.send(self.dp_addrs[st.contexts[msg.context_id]], msg)
            return
        if len(self.dp_addrs) == 1:
            ctx.send(self.dp_addrs[0], msg)
            return
        if len(st.pending) >= MAX_PENDING:
            ctx.send(msg.reply_to, TaskRejected(task_id=msg.task_id, reason="TE dispatch queue full"))
            return
        ctx.record(TaskPending(msg))
        self._maybe_round(ctx)

    def _maybe_round(self, ctx: Context) -> None:
        st = self.state
        if st.round or not st.pending:
            return
        rid = st.rounds + 1
        ctx.record(RoundStarted(rid, len(st.pending)))
        prompts = tuple(t.prompt.block_hashes for t in st.pending)
        for addr in self.dp_addrs:
            ctx.ask(addr, DpMatchQuery(req_id=f"round:{rid}", prompts=prompts), self.cfg.ask_timeout_s)

    def _answer(self, ctx: Context, req_id: str, ans: DpMatch | None, dp: int | None = None) -> None:
        st = self.state
        if req_id != f"round:{st.round}":
            return
        g = ans.load.dp if ans is not None else dp
        assert g is not None
        ctx.record(RoundAnswer(g, ans))
        if len(st.answers) == len(self.dp_addrs):
            self._assign(ctx)

    def _ask_failed(self, ctx: Context, msg: AskFailed) -> None:
        self._answer(ctx, f"round:{self.state.round}", None, self.dp_addrs.index(msg.target))

    def _assign(self, ctx: Context) -> None:
        st, cfg = self.state, self.cfg
        live = sorted(int(g) for g, a in st.answers.items() if a is not None)
        tasks = st.pending[: st.round_tasks]
        if not live:
            ctx.record(RoundAssigned(tuple(-1 for _ in tasks)))
            for t in tasks:
                ctx.send(t.reply_to, TaskRejected(task_id=t.task_id, reason="no DP group answered"))
            return
        loads = [st.answers[str(g)].load for g in live]  # type: ignore[union-attr]
        pend = [
            Pending(t.prompt.num_tokens, _reserve(t), tuple(st.answers[str(g)].hit_blocks[i] for g in live),  # type: ignore[union-attr]
                    decode=t.kind == "decode" or cfg.role == "decode")
            for i, t in enumerate(tasks)
        ]  # fmt: skip
        block = cfg.dps[0].block_tokens
        picks = assign(loads, pend, block, cfg.balancer, st.rr_next)
        groups = tuple(live[p] for p in picks)
        ctx.record(RoundAssigned(groups))
        for t, g in zip(tasks, groups, strict=True):
            ctx.send(self.dp_addrs[g], t)
        self._maybe_round(ctx)

    # ---- context caching ----------------------------------------------------------------
    def _context(self, ctx: Context, msg: CreateContext | GetContext | DeleteContext) -> None:
        st = self.state
        where = st.contexts.get(msg.context_id)
        msg = msgspec.structs.replace(msg, reply_to=msg.reply_to or ctx.sender)
        if isinstance(msg, CreateContext):
            if where is not None:
                ctx.reply(ContextInfo(req_id=msg.req_id, context_id=msg.context_id, found=True,
                                      dp=where, error="exists already"))  # fmt: skip
                return
            g = min(range(len(self.dp_addrs)), key=lambda i: (st.dispatched[i], i))
            ctx.record(ContextPlaced(msg.context_id, g))
            ctx.send(self.dp_addrs[g], msg)
            return
        if where is None:
            ctx.reply(ContextInfo(req_id=msg.req_id, context_id=msg.context_id, found=False))
            return
        if isinstance(msg, DeleteContext):
            ctx.record(ContextDropped(msg.context_id))
        ctx.send(self.dp_addrs[where], msg)

    # ---- health and load ---------------------------------------------------------------
    def _report_tick(self, ctx: Context) -> None:
        ctx.after(self.cfg.report_interval_s, ReportTick(), key="report")
        if self.state.reporting:
            self._send_report(ctx)  # a group did not answer in time: report what came
        ctx.record(ReportStarted())
        for i, addr in enumerate(self.dp_addrs):
            ctx.send(addr, DpStatusQuery(req_id=f"report:{i}"))  # a silent group: next tick

    def _report_answer(self, ctx: Context, dp: int, load: DpLoad) -> None:
        if not self.state.reporting:
            return
        ctx.record(ReportAnswer(dp, load))
        if len(self.state.report) == len(self.dp_addrs):
            self._send_report(ctx)

    def _send_report(self, ctx: Context) -> None:
        loads = [ld for ld in self.state.report.values() if ld is not None]
        used = sum(ld.kv_blocks_used for ld in loads)
        total = sum(ld.kv_blocks_total for ld in loads) or 1
        prompt = sum(ld.prompt_tokens for ld in loads)
        cached = sum(ld.cached_prompt_tokens for ld in loads)
        report = TeLoadReport(
            te=self.cfg.te, at_s=ctx.now(), healthy=len(loads) == len(self.dp_addrs),
            waiting=sum(ld.waiting for ld in loads), running=sum(ld.running for ld in loads),
            kv_usage=used / total, prefix_hit_rate=cached / prompt if prompt else 0.0,
            dps=tuple(sorted(loads, key=lambda ld: ld.dp)),
        )  # fmt: skip
        ctx.record(ReportSent())
        assert self.cfg.cluster_manager is not None
        ctx.send(self.cfg.cluster_manager, report)


def _reserve(t: SubmitTask) -> int:
    s = t.sampling
    return s.max_tokens if s.target_output_tokens is None else min(s.max_tokens, s.target_output_tokens)
