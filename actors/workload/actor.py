"""The workload actor: arrivals in, tasks out to the TEs, one terminal record per request.

A stand-in for issue 6's JE, just enough to drive FlowServe from a trace: colocated TEs get one
`chat` task each, round-robin; a P/D pair gets a `prefill` task, then — with the KV handle the
prefill registered — a `decode` task (xDeepServe §5.1). A prefill TE that rejects a task
(P/D-Serve on-demand forwarding) is retried on the next one until every prefill TE has refused.
Every request ends in exactly one `RequestFinished` event (and one `RequestDone` to `METRICS_ADDR`);
a late or duplicate terminal message is counted and ignored.
"""

from __future__ import annotations

from typing import Literal

from deepserve.actors.flowserve.messages import (
    SubmitTask,
    TaskFinished,
    TaskRejected,
)
from deepserve.core import Actor, Context, Event, Message

from .messages import (
    METRICS_ADDR,
    Arrive,
    EndOfRun,
    LateTaskTerminal,
    Pending,
    RequestDispatched,
    RequestDone,
    RequestFinished,
    RequestPrefilled,
    WorkloadState,
)


def task_id(request_id: str, phase: str, attempt: int) -> str:
    return f"{request_id}/{phase}" if attempt == 1 else f"{request_id}/{phase}.{attempt}"


def request_of(task: str) -> str:
    return task.rpartition("/")[0]


class Workload(Actor[WorkloadState]):
    # A trace's arrivals wait in the driver's queue, not in the actor: see run.py (windows).
    snapshot_every = 4096

    def __init__(
        self,
        mode: Literal["colocated", "pd"],
        tes: list[str] | None = None,
        prefill_tes: list[str] | None = None,
        decode_tes: list[str] | None = None,
        stream: bool = True,
    ) -> None:
        self.mode = mode
        # False (a trace replay that only measures): the TEs send no TaskAccepted/TaskTokens
        # here, which this actor ignores anyway — a dozen deliveries a request saved.
        self.stream = stream
        self.roles: dict[str, list[str]] = {
            "chat": list(tes or []), "prefill": list(prefill_tes or []),
            "decode": list(decode_tes or []),
        }  # fmt: skip
        needed = ("chat",) if mode == "colocated" else ("prefill", "decode")
        for role in needed:
            if not self.roles[role]:
                raise ValueError(f"workload: mode {mode!r} needs at least one {role} TE")

    def initial_state(self) -> WorkloadState:
        return WorkloadState()

    def evolve(self, s: WorkloadState, e: Event) -> WorkloadState:
        # In place: the kernel rebuilds from snapshot + events after a failed handler.
        if isinstance(e, RequestDispatched):
            s.rr[e.phase] = s.rr.get(e.phase, 0) + 1
            p = s.pending.get(e.request_id)
            if p is None:
                s.arrived += 1
                s.pending[e.request_id] = Pending(
                    e.arrival_s, e.phase, e.te, e.attempt, prompt=e.prompt, sampling=e.sampling,
                    model=e.model,
                )  # fmt: skip
            else:
                p.phase, p.te, p.attempt = e.phase, e.te, e.attempt
                if e.phase == "decode":
                    p.prompt = p.sampling = None  # no longer needed
        elif isinstance(e, RequestPrefilled):
            p = s.pending[e.request_id]
            p.first_token_s, p.cached_prompt_tokens = e.first_token_s, e.cached_prompt_tokens
        elif isinstance(e, LateTaskTerminal):
            s.duplicates += 1
        elif isinstance(e, RequestFinished):
            del s.pending[e.done.request_id]
            if e.done.status == "completed":
                s.completed += 1
            elif e.done.status == "failed":
                s.failed += 1
            else:
                s.cancelled += 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, TaskFinished):
            self._on_finished(ctx, msg)
        elif isinstance(msg, Arrive):
            self._on_arrive(ctx, msg)
        elif isinstance(msg, TaskRejected):
            self._on_rejected(ctx, msg)
        elif isinstance(msg, EndOfRun):
            for rid, p in list(self.state.pending.items()):
                self._finish(ctx, rid, p, "failed", msg.reason, 0, 0, p.first_token_s, ctx.now(), p.te)
        # TaskAccepted and TaskTokens change nothing here: the timings come with TaskFinished.

    # ---- handlers ----------------------------------------------------------------------------
    def _on_arrive(self, ctx: Context, msg: Arrive) -> None:
        if msg.request_id in self.state.pending:
            return  # a duplicate arrival: the request is already in flight
        phase: Literal["chat", "prefill", "decode"] = "chat" if self.mode == "colocated" else "prefill"
        te = self._next(phase)
        keep = self.mode == "pd"
        ctx.record(RequestDispatched(
            request_id=msg.request_id, phase=phase, te=te, arrival_s=ctx.now(),
            prompt=msg.prompt if keep else None, sampling=msg.sampling if keep else None,
            model=msg.model if keep else "",
        ))  # fmt: skip
        ctx.send(te, SubmitTask(
            task_id=task_id(msg.request_id, phase, 1), request_id=msg.request_id, kind=phase,
            model=msg.model, prompt=msg.prompt, sampling=msg.sampling, reply_to=ctx.self,
            arrival_s=ctx.now(), stream=self.stream,
        ), corr=msg.request_id)  # fmt: skip

    def _on_rejected(self, ctx: Context, msg: TaskRejected) -> None:
        rid = request_of(msg.task_id)
        p = self.state.pending.get(rid)
        if p is None or msg.task_id != task_id(rid, p.phase, p.attempt):
            return
        if p.phase != "prefill" or p.attempt >= len(self.roles["prefill"]) or p.prompt is None:
            why = f"rejected by {p.te}: {msg.reason}"
            self._finish(ctx, rid, p, "failed", why, 0, 0, None, ctx.now(), p.te)
            return
        te, attempt = self._next("prefill"), p.attempt + 1
        ctx.record(RequestDispatched(request_id=rid, phase="prefill", te=te, arrival_s=p.arrival_s,
                              attempt=attempt))  # fmt: skip
        ctx.send(te, SubmitTask(
            task_id=task_id(rid, "prefill", attempt), request_id=rid, kind="prefill",
            model=p.model, prompt=p.prompt, sampling=p.sampling, reply_to=ctx.self,  # type: ignore[arg-type]
            arrival_s=p.arrival_s, stream=self.stream,
        ), corr=rid)  # fmt: skip

    def _on_finished(self, ctx: Context, msg: TaskFinished) -> None:
        rid = msg.request_id
        p = self.state.pending.get(rid)
        if p is None or msg.task_id != task_id(rid, p.phase, p.attempt):
            ctx.record(LateTaskTerminal(task_id=msg.task_id, status=msg.status, reason=msg.reason))
            return
        if p.phase == "prefill" and msg.status == "completed" and msg.kv is not None:
            self._to_decode(ctx, rid, p, msg)
            return
        first = msg.first_token_s if p.phase != "decode" else p.first_token_s
        cached = msg.cached_prompt_tokens if p.phase != "decode" else p.cached_prompt_tokens
        self._finish(ctx, rid, p, msg.status, msg.reason, msg.prompt_tokens, cached, first,
                     msg.finish_s, msg.te or p.te, msg.output_tokens)  # fmt: skip

    def _to_decode(self, ctx: Context, rid: str, p: Pending, msg: TaskFinished) -> None:
        prompt, sampling, model = p.prompt, p.sampling, p.model
        if msg.kv is None or prompt is None or sampling is None:  # callers check; never silent
            self._finish(ctx, rid, p, "failed", "prefill finished without its KV handle", 0, 0,
                         msg.first_token_s, msg.finish_s, msg.te or p.te)  # fmt: skip
            return
        ctx.record(RequestPrefilled(request_id=rid, first_token_s=msg.first_token_s,
                             cached_prompt_tokens=msg.cached_prompt_tokens, kv=msg.kv))  # fmt: skip
        te = self._next("decode")
        ctx.record(RequestDispatched(request_id=rid, phase="decode", te=te, arrival_s=p.arrival_s))
        ctx.send(te, SubmitTask(
            task_id=task_id(rid, "decode", 1), request_id=rid, kind="decode", model=model,
            prompt=prompt, sampling=sampling, reply_to=ctx.self, kv_source=msg.kv,
            arrival_s=p.arrival_s, stream=self.stream,
        ), corr=rid)  # fmt: skip

    # ---- helpers -------------------------------------------------------------------------------
    def _next(self, role: str) -> str:
        tes = self.roles[role]
        return tes[self.state.rr.get(role, 0) % len(tes)]

    def _finish(self, ctx: Context, rid: str, p: Pending, status: str, reason: str,
                prompt_tokens: int, cached: int, first: float | None, finish: float, te: str,
                output_tokens: int = 0) -> None:  # fmt: skip
        done = RequestDone(
            request_id=rid, status=status, reason=reason, arrival_s=p.arrival_s,  # type: ignore[arg-type]
            first_token_s=first, finish_s=finish, prompt_tokens=prompt_tokens,
            cached_prompt_tokens=cached, output_tokens=output_tokens, te=te,
        )  # fmt: skip
        ctx.record(RequestFinished(done=done))
        ctx.send(METRICS_ADDR, done, corr=rid)

