"""The JE's decision core without a driver: a `Plan` for its effects, a clock, the timers it set,
and the tasks it sent (to answer as a TE would). What `test_je_core.py` drives."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.messages import (
    KvHandle,
    Prompt,
    Sampling,
    SubmitTask,
    TaskAccepted,
    TaskFinished,
    TaskRejected,
    TaskTokens,
)
from deepserve.actors.je.config import JeConfig
from deepserve.actors.je.core import JeCore
from deepserve.actors.je.effects import After, Cancel, Effect, Plan, Send
from deepserve.actors.je.messages import JeState, JobRequest, TeGroupMembership
from deepserve.core import Message

MODEL = "m"
CLIENT = "ext/client"


def request(i: int, stream: bool = True, prompt: int = 256, blocks: tuple[int, ...] = ()) -> JobRequest:
    return JobRequest(request_id=f"r{i}", model=MODEL, prompt=Prompt(num_tokens=prompt, block_hashes=blocks),
                      sampling=Sampling(max_tokens=4, target_output_tokens=4, seed=i), reply_to=CLIENT,
                      stream=stream)  # fmt: skip


class Harness:
    """One JE core, its state, and the world it talks to, all as data."""

    def __init__(self, config: dict[str, Any] | None = None, groups: dict[str, list[str]] | None = None) -> None:
        self.core = JeCore(msgspec.convert(config or {}, JeConfig))
        self.core.me = "je/0"
        self.plan = Plan(JeState(), self.core.cfg.max_tree_blocks)
        self.now = 0.0
        self.timers: dict[str, tuple[float, int, Message]] = {}  # key -> (when, order set, message)
        self.set_count = 0
        self.log: list[Effect] = []  # every effect so far, in order
        self.sent: dict[str, SubmitTask] = {}  # task id -> the task, as its TE got it
        self.te_of: dict[str, str] = {}  # task id -> the TE it was sent to
        self.answered: set[str] = set()  # tasks a TE finished or rejected (a TE answers once)
        self.accepted: set[str] = set()
        for role, tes in (groups or {}).items():
            self.deliver(TeGroupMembership(model=MODEL, role=role, tes=tuple(tes)))  # type: ignore[arg-type]

    @property
    def state(self) -> JeState:
        return self.plan.state

    def deliver(self, msg: Message) -> list[Effect]:
        """One input through the core; its effects (also kept in `log`, timers and tasks noted)."""
        self.core.handle(self.plan.state, self.now, self.plan, msg)
        steps = self.plan.take()
        for fx in steps:
            if isinstance(fx, After):
                self.set_count += 1
                key = fx.key if fx.key is not None else f"t{self.set_count}"
                self.timers[key] = (self.now + fx.delay_s, self.set_count, fx.msg)
            elif isinstance(fx, Cancel):
                self.timers.pop(fx.key, None)
            elif isinstance(fx, Send) and isinstance(fx.msg, SubmitTask):
                self.sent[fx.msg.task_id] = fx.msg
                self.te_of[fx.msg.task_id] = fx.dst
        self.log += steps
        return steps

    def fire_next(self) -> bool:
        """The earliest timer fires (the clock moves to it); False when none is set."""
        if not self.timers:
            return False
        key = min(self.timers, key=lambda k: self.timers[k][:2])
        at, _, msg = self.timers.pop(key)
        self.now = max(self.now, at)
        self.deliver(msg)
        return True

    def open_tasks(self) -> list[str]:
        """Tasks sent and not yet finished or rejected by their TE, oldest first."""
        return [t for t in self.sent if t not in self.answered]

    # ---- a TE's answers ------------------------------------------------------------------------
    def accept(self, tid: str) -> list[Effect]:
        self.accepted.add(tid)
        te = self._te(tid)
        return self.deliver(TaskAccepted(task_id=tid, te=te, dp=0, master=te))

    def stream(self, tid: str) -> list[Effect]:
        t = self.sent[tid]
        return self.deliver(TaskTokens(task_id=tid, request_id=t.request_id, first_index=0, token_ids=(1,),
                                       times_s=(self.now,)))  # fmt: skip

    def reject(self, tid: str, reason: str = "queue full: no free slot") -> list[Effect]:
        self.answered.add(tid)
        return self.deliver(TaskRejected(task_id=tid, reason=reason))

    def finish(self, tid: str, ok: bool = True, reason: str = "") -> list[Effect]:
        self.answered.add(tid)
        t, te = self.sent[tid], self._te(tid)
        kv = None
        if ok and t.kind == "prefill":
            kv = KvHandle(transfer_id=tid, src=te, npus=(), model=t.model, num_tokens=t.prompt.num_tokens,
                          block_ids=(), fingerprints=(), block_bytes=0, first_token_id=1)  # fmt: skip
        why = reason or ("prefilled" if kv is not None else "target" if ok else "NPU crashed")
        out = 1 if t.kind == "prefill" else 4
        return self.deliver(TaskFinished(
            task_id=tid, request_id=t.request_id, status="completed" if ok else "failed", reason=why,
            prompt_tokens=t.prompt.num_tokens, cached_prompt_tokens=0, output_tokens=out if ok else 0,
            first_token_s=self.now, finish_s=self.now, te=te, kv=kv, queued_s=self.now, scheduled_s=self.now,
        ))  # fmt: skip

    def _te(self, tid: str) -> str:
        return self.te_of[tid]
