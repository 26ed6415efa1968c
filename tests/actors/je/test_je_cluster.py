"""The JE's side of the control plane: cancellation from the frontend (to the TE, ended as
cancelled even when the TE is gone), tokens streamed past the JE to a live frontend, and draining members
(no new tasks, open ones kept) against removed ones (open tasks failed over)."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve.messages import (
    CancelTask,
    Prompt,
    Sampling,
    SubmitTask,
    TaskAccepted,
    TaskFinished,
    TaskTokens,
    TokenBatch,
)
from deepserve.actors.je.actor import JobExecutor
from deepserve.actors.je.messages import CancelJob, JobRequest, TeGroupMembership
from deepserve.actors.workload.messages import RequestDone
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

MODEL = "m"


class Tick(Message, frozen=True):
    task_id: str


class StreamingTe(Actor[dict]):
    """Streams one token every `tpot_s` until `target_output_tokens` — to `stream_to` when the
    task names one (and its first chunk to `reply_to` too), as a DP master does; `CancelTask`
    ends the task as cancelled at the next token; `dead` answers nothing at all."""

    def __init__(self, tpot_s: float = 0.1, dead: bool = False) -> None:
        self.tpot, self.dead = tpot_s, dead
        self.tasks: dict[str, list[Any]] = {}

    def handle(self, ctx: Context, msg: Message) -> None:
        if self.dead:
            return
        if isinstance(msg, SubmitTask):
            ctx.send(msg.reply_to, TaskAccepted(task_id=msg.task_id, te=ctx.self, dp=0, master=ctx.self))
            self.tasks[msg.task_id] = [msg, 0, ""]
            ctx.after(self.tpot, Tick(msg.task_id))
        elif isinstance(msg, CancelTask) and msg.task_id in self.tasks:
            self.tasks[msg.task_id][2] = msg.reason
        elif isinstance(msg, Tick) and msg.task_id in self.tasks:
            t, n, cancelled = self.tasks[msg.task_id]
            if cancelled or n + 1 >= (t.sampling.target_output_tokens or 1):
                del self.tasks[msg.task_id]
                status = "cancelled" if cancelled else "completed"
                ctx.send(t.reply_to, TaskFinished(task_id=t.task_id, request_id=t.request_id, status=status,
                                                  reason=cancelled or "target", prompt_tokens=t.prompt.num_tokens,
                                                  cached_prompt_tokens=0, output_tokens=n, first_token_s=0.0,
                                                  finish_s=ctx.now(), te=ctx.self))  # fmt: skip
                return
            self.tasks[msg.task_id][1] = n + 1
            chunk = TaskTokens(task_id=t.task_id, request_id=t.request_id, first_index=n, token_ids=(n,),
                               times_s=(ctx.now(),))  # fmt: skip
            if t.stream_to:
                ctx.send(t.stream_to, TokenBatch(chunks=(chunk,)))
            if not t.stream_to or n == 0:
                ctx.send(t.reply_to, chunk)
            ctx.after(self.tpot, Tick(msg.task_id))


def job(i: int, out: int = 20) -> JobRequest:
    return JobRequest(request_id=f"r{i}", model=MODEL, prompt=Prompt(num_tokens=10),
                      sampling=Sampling(max_tokens=out, target_output_tokens=out), reply_to="ext/client")  # fmt: skip


def driver(tes: dict[str, dict[str, Any]], members: tuple[str, ...], draining: tuple[str, ...] = ()) -> tuple[SimDriver, list[Any]]:
    d = SimDriver(9, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append((env.dst, env.msg))
    for te, kw in tes.items():
        d.spawn(te, StreamingTe, **kw)
    d.spawn("je/0", JobExecutor, config={"stream_to": "ext/stream", "forwarding": {"accept_timeout_s": 1.0}})
    d.inject("je/0", TeGroupMembership(model=MODEL, role="colocated", tes=members, draining=draining), at=0.0)
    return d, out


def dones(out: list[Any]) -> dict[str, RequestDone]:
    return {m.request_id: m for _, m in out if isinstance(m, RequestDone)}


def test_cancel_reaches_the_te_and_ends_the_request_once_as_cancelled() -> None:
    d, out = driver({"te/0": {}}, ("te/0",))
    d.inject("je/0", job(0), at=0.01)
    d.inject("je/0", CancelJob(request_id="r0", reason="the client disconnected"), at=0.55)
    d.inject("je/0", CancelJob(request_id="r0", reason="twice"), at=0.56)
    d.run(until=10.0)
    done = dones(out)
    assert [m.request_id for _, m in out if isinstance(m, RequestDone)] == ["r0"]
    assert (done["r0"].status, done["r0"].reason) == ("cancelled", "the client disconnected")
    tokens = [c for dst, m in out if isinstance(m, TokenBatch) and dst == "ext/stream" for c in m.chunks]
    assert not [m for _, m in out if isinstance(m, TaskTokens)]  # the JE relays nothing
    assert len(tokens) == done["r0"].output_tokens == 5  # 0.1 s a token, cancelled at 0.55 s
    to_je = [s for s in d.sink.steps if s.input.actor == "je/0" and s.input.type == "TaskTokens"]
    assert len(to_je) == 1  # the JE hears of the first chunk only: one TaskStreamed, not one a chunk
    assert d.actor("je/0").state.jobs == {}
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_stop_sequence_ends_the_request_completed_not_cancelled() -> None:
    """The frontend cancels the task when the text hits a stop sequence; the client has all it
    asked for, so the request counts as completed (a tour saw stops counted as cancelled)."""
    d, out = driver({"te/0": {}}, ("te/0",))
    d.inject("je/0", job(0), at=0.01)
    d.inject("je/0", CancelJob(request_id="r0", reason="stop sequence", completed=True), at=0.55)
    d.run(until=10.0)
    r = dones(out)["r0"]
    assert (r.status, r.reason, r.output_tokens) == ("completed", "stop sequence", 5)
    s = d.actor("je/0").state
    assert (s.completed, s.failed, s.jobs) == (1, 0, {})
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_cancel_the_te_never_answers_ends_at_the_deadline() -> None:
    d, out = driver({"te/0": {}}, ("te/0",))
    d.inject("je/0", job(0), at=0.01)
    d.inject("te/0", TeGroupMembership(model=MODEL, role="colocated", tes=()), at=0.3)  # harmless noise
    d.run(until=0.35)
    d.actor("te/0").dead = True  # the TE stops answering (its actors hang)
    d.inject("je/0", CancelJob(request_id="r0"), at=0.4)
    d.run(until=5.0)
    r = dones(out)["r0"]
    assert r.status == "cancelled" and "no answer from te/0" in r.reason and r.finish_s == 1.4


def test_draining_keeps_open_tasks_but_takes_no_new_ones_and_removal_fails_over() -> None:
    d, out = driver({"te/0": {}, "te/1": {}}, ("te/0", "te/1"))
    for i in range(2):  # round robin: r0 -> te/0, r1 -> te/1
        d.inject("je/0", job(i), at=0.01 * (i + 1))
    d.inject("je/0", TeGroupMembership(model=MODEL, role="colocated", tes=("te/0",), draining=("te/1",)), at=0.2)
    d.inject("je/0", job(2), at=0.3)
    d.inject("je/0", job(3, out=3), at=0.4)
    d.inject("je/0", TeGroupMembership(model=MODEL, role="colocated", tes=("te/1",)), at=0.75)  # te/0 gone
    d.run(until=20.0)
    done = dones(out)
    assert (done["r1"].status, done["r1"].te) == ("completed", "te/1")  # drained, not failed over
    assert done["r0"].status == "failed" and "te/0 left the colocated group" in done["r0"].reason
    assert done["r2"].status == "failed"  # streamed on te/0 before it left
    # the TE that failed them is named (it was "": the daemon's log lines had `actor=""`)
    assert (done["r0"].te, done["r2"].te) == ("te/0", "te/0")
    assert (done["r3"].status, done["r3"].te) == ("completed", "te/0")  # finished before the removal
