"""A test double of a TE for the workload actor's own tests: it answers SubmitTask with a fixed
timeline (no NPU, no RTC), so the workload's bookkeeping is tested alone. The real TEs are
exercised by the scenario tests (tests/scenarios/)."""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.messages import (
    KvHandle,
    SubmitTask,
    TaskAccepted,
    TaskFinished,
    TaskRejected,
)
from deepserve.core import Actor, Context, Message


class FakeTeEmit(Message, frozen=True):
    task_id: str


class FakeTe(Actor[dict]):
    def __init__(self, prefill_s_per_token: float = 1e-4, tpot_s: float = 0.01,
                 reject: bool = False, duplicate: bool = False, hang: bool = False) -> None:  # fmt: skip
        self.prefill = prefill_s_per_token
        self.tpot = tpot_s
        self.reject, self.duplicate, self.hang = reject, duplicate, hang
        self.tasks: dict[str, SubmitTask] = {}

    def initial_state(self) -> dict:
        return {}

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, SubmitTask):
            if self.reject:
                ctx.send(msg.reply_to, TaskRejected(task_id=msg.task_id, reason="queue full"))
                return
            ctx.send(msg.reply_to, TaskAccepted(task_id=msg.task_id, te=ctx.self, dp=0, master=ctx.self))
            if self.hang:
                return
            self.tasks[msg.task_id] = msg
            n = msg.prompt.num_tokens if msg.kind != "decode" else 0
            out = 1 if msg.kind == "prefill" else (msg.sampling.target_output_tokens or 1)
            if msg.kind == "decode":
                out -= 1
            ctx.after(n * self.prefill + max(out - 1, 0) * self.tpot + 0.001, FakeTeEmit(msg.task_id))
        elif isinstance(msg, FakeTeEmit):
            t = self.tasks.pop(msg.task_id)
            now = ctx.now()
            n = t.prompt.num_tokens
            target = t.sampling.target_output_tokens or 1
            kv = None
            if t.kind == "prefill":
                kv = KvHandle(transfer_id=t.task_id, src=ctx.self, npus=(), model=t.model,
                              num_tokens=n, block_ids=(), fingerprints=(), block_bytes=0,
                              first_token_id=1)  # fmt: skip
            first = now - (target - 1) * self.tpot if t.kind == "chat" else now
            done = TaskFinished(
                task_id=t.task_id, request_id=t.request_id, status="completed",
                reason="prefilled" if kv else "target", prompt_tokens=n,
                cached_prompt_tokens=n // 2, output_tokens=target if t.kind != "prefill" else 1,
                first_token_s=first, finish_s=now, te=ctx.self, kv=kv,
            )  # fmt: skip
            ctx.send(t.reply_to, done)
            if self.duplicate:
                ctx.send(t.reply_to, msgspec.structs.replace(done, status="failed", reason="dup"))
