"""The JE's decision core on its own, no driver (actors/je/core.py through je_harness.Harness):
exact effects and state for the protocol's main paths, the retry rule as a table, and the
protocol's invariants under random TE behaviour — every job ends in exactly one terminal state,
no job has more failed tasks than `max_attempts`, and a streaming job whose client saw output is
never started again."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from je_harness import CLIENT, MODEL, Harness, request

from deepserve.actors.flowserve.messages import Prompt, Sampling, SubmitTask, TaskAccepted
from deepserve.actors.je import decide as D
from deepserve.actors.je.effects import After, Cancel, Send
from deepserve.actors.je.messages import (
    AcceptTimeout,
    CancelJob,
    JePrefilled,
    JeTaskEnded,
    Job,
    JobAccepted,
    JobFinished,
    OfferRefused,
    ParkTimeout,
    PrefillSetAside,
    RouteDecided,
    TaskStreamed,
    TeGroupMembership,
)
from deepserve.actors.je.stream import StreamMerge
from deepserve.actors.workload.messages import RequestDone

COLO = {"colocated": ["te/0", "te/1"]}
PD = {"prefill": ["te/p0", "te/p1"], "decode": ["te/d0", "te/d1"]}
QUIET = {"kv_events": False}  # no KV event subscriptions among the effects


def kinds(steps: list) -> list[str]:
    return [type(x.msg).__name__ if isinstance(x, Send) else type(x).__name__ for x in steps]


# ---- exact effects -----------------------------------------------------------------------------


def test_a_job_is_accepted_routed_sent_and_timed() -> None:
    h = Harness({**QUIET, "policy": "round_robin"}, COLO)
    steps = h.deliver(request(1))
    assert kinds(steps) == ["JobAccepted", "RouteDecided", "SubmitTask", "After"]
    routed, send, timer = steps[1], steps[2], steps[3]
    assert isinstance(routed, RouteDecided) and (routed.task_id, routed.phase, routed.attempt) == ("r1/chat.1", "chat", 1)
    assert routed.decision.chosen == "te/0" and routed.decision.policy == "round_robin"
    assert isinstance(send, Send) and send.dst == "te/0" and send.corr == "r1"
    assert isinstance(send.msg, SubmitTask) and send.msg.reply_to == "je/0" and send.msg.kind == "chat"
    assert timer == After(1.0, AcceptTimeout(task_id="r1/chat.1"), "acc/r1/chat.1")
    j = h.state.jobs["r1"]
    assert (j.phase, j.task_id, j.te, j.attempt, j.acked) == ("chat", "r1/chat.1", "te/0", 1, False)
    assert h.state.open == {"te/0": 1} and h.state.turns == 1 and h.state.online == 1
    assert kinds(h.accept("r1/chat.1")) == ["TaskAcked", "Cancel"] and h.state.jobs["r1"].acked
    steps = h.finish("r1/chat.1")
    # the accept timer is cancelled twice: by the answer, and by the job's end (the log's order)
    assert kinds(steps) == ["Cancel", "Cancel", "JobFinished", "RequestDone"]
    done = steps[3]
    assert isinstance(done, Send) and done.dst == CLIENT and isinstance(done.msg, RequestDone)
    assert (done.msg.status, done.msg.te, done.msg.output_tokens) == ("completed", "te/0", 4)
    assert h.state.jobs == {} and h.state.open == {"te/0": 0} and h.state.completed == 1


def test_a_failed_task_is_retried_on_another_te_until_max_attempts() -> None:
    h = Harness({**QUIET, "max_attempts": 2, "policy": "round_robin"}, COLO)
    h.deliver(request(1))
    steps = h.finish("r1/chat.1", ok=False)
    assert kinds(steps) == ["Cancel", "JeTaskEnded", "RouteDecided", "SubmitTask", "After"]
    assert steps[1] == JeTaskEnded(request_id="r1", task_id="r1/chat.1", te="te/0", status="failed",
                                   reason="failed on te/0: NPU crashed")  # fmt: skip
    retry = steps[2]
    assert isinstance(retry, RouteDecided) and (retry.task_id, retry.decision.chosen) == ("r1/chat.2", "te/1")
    assert h.state.jobs["r1"].excluded == ["te/0"]
    assert [e.tes for e in retry.decision.excluded] == [("te/0",)]  # replay why names it
    steps = h.finish("r1/chat.2", ok=False)
    assert kinds(steps) == ["Cancel", "JeTaskEnded", "JobFinished", "RequestDone"]
    end = steps[2]
    assert isinstance(end, JobFinished)
    assert (end.done.status, end.done.reason) == ("failed", "gave up after 2 attempts: failed on te/1: NPU crashed")
    assert end.done.te == "te/1" and h.state.failed == 1 and h.state.jobs == {}


def test_a_streamed_task_is_never_retried_but_a_non_streaming_clients_is() -> None:
    h = Harness(QUIET, COLO)
    h.deliver(request(1))
    assert kinds(h.stream("r1/chat.1")) == ["TaskStreamed"]
    end = h.finish("r1/chat.1", ok=False)[2]
    assert isinstance(end, JobFinished) and end.done.reason == (
        "its generation (prefill and decode) task failed after output streamed: failed on te/0: NPU crashed")
    h.deliver(request(2, stream=False))
    tid = h.state.jobs["r2"].task_id
    h.stream(tid)
    assert h.state.jobs["r2"].output_tokens == 1
    steps = h.finish(tid, ok=False)
    assert kinds(steps)[2] == "RouteDecided"  # the client saw nothing: started again, elsewhere
    j = h.state.jobs["r2"]
    assert (j.attempt, j.output_tokens, j.first_token_s, j.streamed) == (2, 0, None, False)


def test_only_a_streaming_clients_tasks_send_the_je_token_chunks() -> None:
    # a non-streaming job: no TaskTokens to the JE (the accept and the end still come), with or
    # without a frontend streaming the output (`stream_to`: the sim's and the daemon's)
    for cfg in (QUIET, {**QUIET, "stream_to": "ext/stream"}):
        h = Harness(cfg, COLO)
        h.deliver(request(1))
        h.deliver(request(2, stream=False))
        assert (h.sent["r1/chat.1"].tokens, h.sent["r2/chat.1"].tokens) == (True, False)


def test_a_single_dp_tes_next_tasks_go_to_its_master_until_it_leaves_the_group() -> None:
    h = Harness(QUIET, {"colocated": ["te/0"]})
    h.deliver(request(1))
    assert h.te_of["r1/chat.1"] == "te/0"  # nothing known yet: through the shell
    h.deliver(TaskAccepted(task_id="r1/chat.1", te="te/0", dp=0, master="te/0/dp/0", solo=True))
    h.deliver(request(2))
    assert h.te_of["r2/chat.1"] == "te/0/dp/0" and h.state.jobs["r2"].te == "te/0"  # past the shell
    h.deliver(TeGroupMembership(model=MODEL, role="colocated", tes=(), version=1))
    h.deliver(TeGroupMembership(model=MODEL, role="colocated", tes=("te/0",), version=2))  # replaced
    h.deliver(request(3))
    assert h.te_of["r3/chat.1"] == "te/0"  # a TE back in the group is asked through its shell again
    many = Harness(QUIET, {"colocated": ["te/0"]})  # several DP groups: the shell balances them
    many.deliver(request(1))
    many.deliver(TaskAccepted(task_id="r1/chat.1", te="te/0", dp=1, master="te/0/dp/1", solo=False))
    many.deliver(request(2))
    assert many.te_of["r2/chat.1"] == "te/0"


def test_a_prefill_hands_its_kv_to_the_least_loaded_decode() -> None:
    h = Harness({**QUIET, "policy": "least_load", "forwarding": {"mode": "local_queue"}}, PD)
    h.state.open["te/d0"] = 3  # te/d1 is the less loaded decode TE
    h.deliver(request(1))
    tid = h.state.jobs["r1"].task_id
    assert tid == "r1/prefill.1" and h.sent[tid].kind == "prefill"
    steps = h.finish(tid)
    assert kinds(steps) == ["Cancel", "JeTaskEnded", "JePrefilled", "RouteDecided", "SubmitTask", "After"]
    prefilled, decode = steps[2], steps[4]
    assert isinstance(prefilled, JePrefilled) and prefilled.te == h.te_of[tid]
    assert isinstance(decode, Send) and decode.dst == "te/d1" and isinstance(decode.msg, SubmitTask)
    assert decode.msg.kind == "decode" and decode.msg.kv_source == prefilled.kv
    assert h.state.jobs["r1"].task_id == "r1/decode.1"


@pytest.mark.parametrize("mode", ["local_queue", "on_demand"])
def test_a_decode_takes_its_prefill_s_attempt_so_the_client_s_stream_follows_it(mode: str) -> None:
    """`deepserve chaos` (2P2D, seeds 7, 8, 13, 15, 19 of 40 requests): a prefill that failed (or,
    on demand, was refused) before any output was retried as `prefill.2`, and its decode went out
    as `decode.1` — ordered below `prefill.2` (stream.task_order), so the frontend dropped every
    decode chunk and the client got 1 token of a completed request."""
    h = Harness({**QUIET, "policy": "least_load", "forwarding": {"mode": mode}}, PD)
    h.deliver(request(1))
    if mode == "on_demand":
        h.reject("r1/prefill.1", "queue full: no free slot; busy")
    else:
        h.finish("r1/prefill.1", ok=False)
    assert h.state.jobs["r1"].task_id == "r1/prefill.2"
    h.finish("r1/prefill.2")
    assert h.state.jobs["r1"].task_id == "r1/decode.2"
    m = StreamMerge()  # the frontend: the prefill's first token, then the decode's
    assert m.take("r1/prefill.2", 0, 1) == 0 and m.take("r1/decode.2", 1, 3) == 0 and m.next == 4


def test_on_demand_a_lost_prefill_is_set_aside_and_a_busy_one_only_passed_over() -> None:
    h = Harness({**QUIET, "policy": "least_load"}, PD)
    h.deliver(request(1))
    first = h.state.jobs["r1"]
    te, other = first.te, ({"te/p0", "te/p1"} - {first.te}).pop()
    steps = h.reject("r1/prefill.1", "device lost: hw/s0/npu0: crashed")
    assert kinds(steps) == ["Cancel", "OfferRefused", "PrefillSetAside", "RouteDecided", "SubmitTask", "After"]
    assert isinstance(steps[1], OfferRefused) and steps[1].permanent
    assert isinstance(steps[2], PrefillSetAside) and steps[2] == PrefillSetAside(
        te=te, until_s=5.0, reason="refused r1/prefill.1: device lost: hw/s0/npu0: crashed")
    offer = steps[3]
    assert isinstance(offer, RouteDecided) and offer.decision.chosen == other and offer.task_id == "r1/prefill.2"
    assert h.state.jobs["r1"].excluded == [te] and h.state.set_aside == {te: 5.0}
    h.deliver(request(2))
    busy = h.state.jobs["r2"].task_id
    steps = h.reject(busy)  # "queue full": busy, not lost — passed over this sweep only
    refused = steps[1]
    assert isinstance(refused, OfferRefused) and not refused.permanent and h.state.jobs["r2"].excluded == []


def test_a_job_for_an_unknown_model_parks_until_the_ttft_deadline() -> None:
    h = Harness(QUIET)
    steps = h.deliver(request(1))
    assert kinds(steps) == ["JobAccepted", "JobParked", "After"]
    assert steps[2] == After(10.0, ParkTimeout(request_id="r1"), "park/r1")
    assert h.state.parked == ["r1"]
    assert h.fire_next() and h.now == 10.0
    end = next(x for x in h.log if isinstance(x, JobFinished))
    assert end.done.reason == "no TE group for model 'm' was pushed in time" and h.state.parked == []


def test_a_parked_job_goes_out_with_the_first_push() -> None:
    h = Harness(QUIET)
    h.deliver(request(1))
    steps = h.deliver(TeGroupMembership(model="m", role="colocated", tes=("te/0",)))
    assert kinds(steps) == ["MembershipChanged", "Cancel", "RouteDecided", "SubmitTask", "After"]
    assert steps[1] == Cancel("park/r1") and h.state.parked == []


def test_a_cancel_goes_to_the_te_and_ends_the_job_when_it_never_answers() -> None:
    h = Harness(QUIET, COLO)
    h.deliver(request(1))
    h.accept("r1/chat.1")
    steps = h.deliver(CancelJob(request_id="r1"))
    assert kinds(steps) == ["JobCancelRequested", "CancelTask", "After"]
    assert h.fire_next()
    end = next(x for x in h.log if isinstance(x, JobFinished))
    assert (end.done.status, end.done.reason) == ("cancelled", "the client disconnected (no answer from te/0)")


# ---- the retry rule, as a table ----------------------------------------------------------------


def _job(**kw: object) -> Job:
    j = Job(model="m", prompt=Prompt(num_tokens=8), sampling=Sampling(max_tokens=1), reply_to=CLIENT, arrival_s=0.0)
    for k, v in kw.items():
        setattr(j, k, v)
    return j


@pytest.mark.parametrize(("job", "phase", "attempt", "want"), [
    (_job(), "chat", 1, D.Retry("chat", 2, "x")),
    (_job(), "chat", 3, D.End("failed", "gave up after 3 attempts: x")),
    (_job(), "prefill", 2, D.Retry("prefill", 3, "x")),
    (_job(start_attempt=1), "decode", 1, D.End("failed", "its decode task failed after output streamed: x")),
    (_job(stream=False, start_attempt=1), "decode", 5, D.Retry("chat", 2, "x")),  # from a new prefill
    (_job(stream=False, start_attempt=3), "decode", 1, D.End("failed", "gave up after 3 attempts: x")),
    (_job(streamed=True), "chat", 1, D.End("failed", "its generation (prefill and decode) task failed "
                                                     "after output streamed: x")),
    (_job(streamed=True, stream=False), "prefill", 1, D.Retry("prefill", 2, "x")),
    (_job(cancelled="bye"), "chat", 1, D.End("cancelled", "bye")),
])  # fmt: skip
def test_after_failure(job: Job, phase: str, attempt: int, want: object) -> None:
    assert D.after_failure(job, phase, attempt, "x", max_attempts=3) == want


# ---- invariants under random TE behaviour ------------------------------------------------------

GROUPS = {"colocated": COLO, "pd": PD, "mixed": {"colocated": ["te/0"], "prefill": ["te/p0"], "decode": ["te/d0"]}}
REASONS = ("queue full: no free slot", "device lost: hw/s0/npu0: crashed", "model: not served here")
# (kind, which, stream, reason): kinds repeated by how often a run should see them; `which` picks
# an open task, the newest first (so a task often gets several answers in a row: accepted,
# streamed, then failed), or a job to cancel, or a TE to leave its group
KINDS = ("job",) * 3 + ("accept", "stream") * 2 + ("ok",) * 3 + ("fail",) * 2 + ("kvlost", "reject", "reject",
         "fire", "fire", "cancel", "leave")  # fmt: skip
action = st.tuples(st.sampled_from(KINDS), st.integers(0, 3), st.booleans(), st.sampled_from(REASONS))


def _act(h: Harness, a: tuple[str, int, bool, str], jobs: list[str], groups: dict[str, list[str]]) -> None:
    kind, which, stream, reason = a
    open_ = h.open_tasks()
    if kind == "job":
        h.deliver(request(len(jobs), stream=stream))
        jobs.append(f"r{len(jobs)}")
    elif kind == "fire":
        h.fire_next()
    elif kind == "cancel" and jobs:
        h.deliver(CancelJob(request_id=jobs[-1 - which % len(jobs)]))
    elif kind == "leave":  # a TE leaves its group (the cluster manager's push)
        role = sorted(groups)[which % len(groups)]
        tes = groups[role]
        gone = tes[which % len(tes)]
        h.deliver(TeGroupMembership(model="m", role=role, tes=tuple(t for t in tes if t != gone)))  # type: ignore[arg-type]
    elif open_:
        tid = open_[-1 - which % len(open_)]
        if kind == "accept":
            h.accept(tid)
        elif kind == "stream":
            h.stream(tid)
        elif kind == "reject":
            h.reject(tid, reason)
        elif kind == "kvlost":
            h.finish(tid, ok=False, reason="KV transfer failed: link s1/npu0/roce is down")
        else:
            h.finish(tid, ok=kind == "ok")


def _settle(h: Harness) -> None:
    """The world goes quiet: every TE finishes what it holds, every timer fires, until nothing
    is left to happen."""
    for _ in range(5000):
        open_ = h.open_tasks()
        if open_:
            h.finish(open_[0])
        elif not h.fire_next():
            return
    raise AssertionError(f"still busy after 5000 steps: {len(h.state.jobs)} jobs")


def _check(h: Harness, jobs: list[str], max_attempts: int) -> None:
    """The protocol's invariants over everything the core did so far."""
    ends = Counter(e.done.request_id for e in h.log if isinstance(e, JobFinished))
    told = Counter(x.msg.request_id for x in h.log if isinstance(x, Send) and isinstance(x.msg, RequestDone))
    assert set(ends) <= set(jobs) and all(n == 1 for n in ends.values()), ends  # at most one terminal
    assert told == ends  # the client hears exactly what was recorded
    stream = {e.request_id: e.stream for e in h.log if isinstance(e, JobAccepted)}
    failed: Counter[str] = Counter()
    decodes: Counter[str] = Counter()
    seen_output: set[str] = set()  # streaming jobs whose client saw output
    for e in h.log:
        if isinstance(e, JeTaskEnded) and e.status == "failed":
            failed[e.request_id] += 1
            assert failed[e.request_id] <= max_attempts, f"{e.request_id}: {failed[e.request_id]} failed tasks"
        elif isinstance(e, TaskStreamed) and stream[e.task_id.rpartition("/")[0]]:
            seen_output.add(e.task_id.rpartition("/")[0])
        elif isinstance(e, JePrefilled) and stream[e.request_id]:
            seen_output.add(e.request_id)  # the prefill's first token went to the client
        elif isinstance(e, RouteDecided) and e.request_id in seen_output:
            assert e.phase == "decode", f"{e.request_id} restarted after its client saw output: {e.task_id}"
            decodes[e.request_id] += 1
            assert decodes[e.request_id] == 1, f"{e.request_id}: a second decode after output: {e.task_id}"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Found by this property (2026-11-29): a streaming PD job's prefill refused after its first token
# reached the client was re-offered on demand, restarting the request the client was reading.
@example(shape='mixed', forwarding='on_demand', policy='round_robin', max_attempts=1, actions=[
    ('job', 0, False, 'queue full: no free slot'),
    ('job', 0, False, 'queue full: no free slot'),
    ('job', 0, False, 'queue full: no free slot'),
    ('job', 0, True, 'queue full: no free slot'),
    ('accept', 0, False, 'queue full: no free slot'),
    ('stream', 0, False, 'queue full: no free slot'),
    ('reject', 0, False, 'queue full: no free slot'),
    ('job', 0, False, 'queue full: no free slot'),
    ('job', 0, False, 'queue full: no free slot'),
    ('job', 0, False, 'queue full: no free slot'),
])
@given(
    shape=st.sampled_from(sorted(GROUPS)),
    forwarding=st.sampled_from(["on_demand", "local_queue"]),
    policy=st.sampled_from(["round_robin", "least_load", "load_aware"]),
    max_attempts=st.integers(1, 4),
    actions=st.lists(action, min_size=10, max_size=60),
)
def test_every_job_ends_once_within_its_attempts_and_a_streamed_one_is_never_restarted(
        shape: str, forwarding: str, policy: str, max_attempts: int, actions: list[tuple[str, int, bool, str]]) -> None:
    groups = GROUPS[shape]
    h = Harness({**QUIET, "policy": policy, "max_attempts": max_attempts, "forwarding": {"mode": forwarding}},
                groups)  # fmt: skip
    jobs: list[str] = []
    for a in actions:
        _act(h, a, jobs, groups)
        _check(h, jobs, max_attempts)
    _settle(h)
    _check(h, jobs, max_attempts)
    ends = Counter(e.done.request_id for e in h.log if isinstance(e, JobFinished))
    assert sorted(ends) == sorted(jobs) and h.state.jobs == {}  # every job ended, exactly once
    assert sum(h.state.open.values()) == 0 and h.state.waiting == [] and h.state.parked == []


@pytest.mark.parametrize("forged", ["second end", "one failure too many", "restart after output"])
def test_the_invariant_check_catches_each_violation(forged: str) -> None:
    """`_check` is what the property rests on: each invariant, broken by a forged record, fails it."""
    h = Harness({**QUIET, "max_attempts": 2, "policy": "round_robin"}, COLO)
    h.deliver(request(0))
    h.stream("r0/chat.1")
    h.finish("r0/chat.1")
    _check(h, ["r0"], max_attempts=2)  # the real run holds
    end = next(e for e in h.log if isinstance(e, JobFinished))
    more = {
        "second end": [end, Send(CLIENT, end.done)],
        "one failure too many": [JeTaskEnded(request_id="r0", task_id=f"r0/chat.{i}", te="te/0", status="failed",
                                             reason="x") for i in (2, 3, 4)],  # fmt: skip
        "restart after output": [next(e for e in h.log if isinstance(e, RouteDecided))],
    }[forged]
    h.log += more
    with pytest.raises(AssertionError):
        _check(h, ["r0"], max_attempts=2)
