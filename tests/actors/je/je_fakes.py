"""Test doubles of TEs for the JE's and the gateway's own tests: each answers SubmitTask with a
fixed timeline or a scripted misbehaviour (reject, never answer, fail before or after streaming).
The real TEs are exercised by the scenario tests."""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.messages import (
    KV_TRANSFER_FAILED,
    KvHandle,
    SubmitTask,
    TaskAccepted,
    TaskFinished,
    TaskRejected,
    TaskTokens,
)
from deepserve.core import Actor, Context, Message


class ScriptedEmit(Message, frozen=True):
    task_id: str


class ScriptedTe(Actor[dict]):
    """`behaviour`: "ok", "reject", "reject_first" (rejects its first `n` tasks), "dead" (never
    answers), "fail_early" (fails before any token), "fail_late" (streams a token, then fails),
    "slots" (a prefill without a local queue: holds at most `n` tasks, refuses beyond),
    "stream" (streams its first token at once, then works normally), "kv_lost" (a decode whose
    KV never arrives fails saying so; other tasks work), "lost" (its device is lost: refuses every
    task for good, as a master with a crashed NPU does), "preempted" (works, preempted `n` times)."""

    def __init__(self, behaviour: str = "ok", n: int = 0, tpot_s: float = 0.01) -> None:
        self.behaviour, self.n, self.tpot = behaviour, n, tpot_s
        self.tasks: dict[str, SubmitTask] = {}
        self.received: dict[str, float] = {}  # task id -> when it came: queued and scheduled at once
        self.seen = 0

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, SubmitTask):
            self.seen += 1
            b = self.behaviour
            if b == "dead":
                return
            if b == "lost":
                why = "device lost: hw/s9/npu0: crashed: injected crash"
                ctx.send(msg.reply_to, TaskRejected(task_id=msg.task_id, reason=why))
                return
            full = b == "slots" and len(self.tasks) >= self.n
            if b == "reject" or full or (b == "reject_first" and self.seen <= self.n):
                ctx.send(msg.reply_to, TaskRejected(task_id=msg.task_id, reason="queue full: no free slot"))
                return
            ctx.send(msg.reply_to, TaskAccepted(task_id=msg.task_id, te=ctx.self, dp=0, master=ctx.self))
            self.tasks[msg.task_id] = msg
            self.received[msg.task_id] = ctx.now()
            if b in ("fail_late", "stream"):
                ctx.send(msg.reply_to, TaskTokens(task_id=msg.task_id, request_id=msg.request_id,
                                                  first_index=0, token_ids=(1,), times_s=(ctx.now(),)))
            out = msg.sampling.target_output_tokens or 1
            ctx.after(1e-4 * msg.prompt.num_tokens + self.tpot * out, ScriptedEmit(msg.task_id))
        elif isinstance(msg, ScriptedEmit):
            t = self.tasks.pop(msg.task_id)
            now = ctx.now()
            at = self.received[t.task_id]
            if self.behaviour in ("fail_early", "fail_late"):
                ctx.send(t.reply_to, _finished(t, "failed", "NPU crashed", now, ctx.self, None, at))
                return
            if self.behaviour == "kv_lost" and t.kind == "decode":
                why = f"{KV_TRANSFER_FAILED}: link s1/npu0/roce is down"
                ctx.send(t.reply_to, _finished(t, "failed", why, now, ctx.self, None, at))
                return
            kv = None
            if t.kind == "prefill":
                kv = KvHandle(transfer_id=t.task_id, src=ctx.self, npus=(), model=t.model,
                              num_tokens=t.prompt.num_tokens, block_ids=(), fingerprints=(),
                              block_bytes=0, first_token_id=1)  # fmt: skip
            done = _finished(t, "completed", "prefilled" if kv else "target", now, ctx.self, kv, at)
            if self.behaviour == "preempted":
                done = msgspec.structs.replace(done, preemptions=self.n)
            ctx.send(t.reply_to, done)


def _finished(t: SubmitTask, status: str, reason: str, now: float, te: str,
              kv: KvHandle | None, at: float) -> TaskFinished:
    out = 1 if t.kind == "prefill" else (t.sampling.target_output_tokens or 1)
    return TaskFinished(task_id=t.task_id, request_id=t.request_id, status=status, reason=reason,  # type: ignore[arg-type]
                        prompt_tokens=t.prompt.num_tokens, cached_prompt_tokens=0,
                        output_tokens=out if status == "completed" else 0, first_token_s=now,
                        finish_s=now, te=te, kv=kv, queued_s=at, scheduled_s=at)
