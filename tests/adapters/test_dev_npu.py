"""The NPU actor: HBM allocator, one graph at a time from a FIFO queue with the compute model's
durations, and every fault kind (crash, hang, HBM region fault) plus reset."""

from __future__ import annotations

import pytest
from dev_harness import (
    DevAsk,
    DevClientLog,
    answer_for,
    answers,
    assert_state_is_fold,
    events,
    handler_failures,
    log_encoding,
    make_driver,
    send,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.actors.ports.faults import HbmRegionFault, NpuCrash, NpuHang, NpuReset
from deepserve.actors.ports.npu import (
    NpuAlloc,
    NpuAllocFailed,
    NpuAllocOk,
    NpuError,
    NpuForward,
    NpuForwardDone,
    NpuFree,
    NpuFreeOk,
    NpuProbe,
    NpuStatus,
    SeqShape,
)
from deepserve.adapters.hardware.batch import Batch, Parallel, Seq
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import npu_spec
from deepserve.core.records import LATE

NPU = "hw/s0/npu0"
GB = 10**9


def _driver(seed: int = 0, variance: bool = False, **kw):
    d = make_driver(seed=seed)
    d.spawn(NPU, Npu, npu="910b", variance=variance, **kw)
    return d


def _fwd(req_id: str, seqs=((1, 1000),) * 8, regions=("weights", "kv"), model="llama3-8b", tp=1):
    shapes = tuple(SeqShape(n, c) for n, c in seqs)
    return NpuForward(req_id=req_id, model=model, seqs=shapes, tp=tp, regions=regions)


def _model_s(seqs, model="llama3-8b", tp=1) -> float:
    """The compute model's time for the batch, computed here independently of the actor."""
    batch = Batch(seqs=tuple(Seq(n, c) for n, c in seqs))
    return forward_time(model_profile(model), npu_spec("910b"), batch, Parallel(tp=tp)).total_s


def test_one_graph_at_a_time_fifo_with_model_durations():
    d = _driver()
    shapes = [((1, 1000),) * 8, ((2000, 0),), ((1, 100),) * 64]
    for i, seqs in enumerate(shapes):
        send(d, NPU, _fwd(f"f{i}", seqs), at=0.001 * i)
    d.run()
    expected = [_model_s(s) for s in shapes]
    got = [answer_for(d, f"f{i}") for i in range(3)]
    assert [type(m) for _, m in got] == [NpuForwardDone] * 3
    assert [m.duration_s for _, m in got] == pytest.approx(expected, rel=1e-12)
    # strictly one after another, in arrival order
    assert got[0][0] == pytest.approx(expected[0])
    assert got[1][0] == pytest.approx(expected[0] + expected[1])
    assert got[2][0] == pytest.approx(sum(expected))
    assert got[1][1].queued_s == pytest.approx(expected[0] - 0.001)
    assert [m.mode for _, m in got] == ["graph", "single_op", "graph"]
    assert d.actor(NPU).state.completed == 3
    assert_state_is_fold(d, NPU)


def test_hbm_allocator_capacity_regions_and_precise_failures():
    d = _driver()
    send(d, NPU, NpuAlloc(req_id="w", region="weights", nbytes=40 * GB))
    send(d, NPU, NpuAlloc(req_id="k", region="kv", nbytes=20 * GB))
    send(d, NPU, NpuAlloc(req_id="big", region="kv", nbytes=5 * GB))
    send(d, NPU, NpuFree(req_id="f1", region="kv", nbytes=8 * GB))
    send(d, NPU, NpuFree(req_id="f2", region="kv", nbytes=30 * GB))
    send(d, NPU, NpuFree(req_id="f3", region="weights"))
    send(d, NPU, NpuProbe(req_id="p"))
    d.run()
    assert answer_for(d, "w")[1] == NpuAllocOk(
        req_id="w", region="weights", nbytes=40 * GB, region_bytes=40 * GB, hbm_bytes_free=24 * GB
    )
    assert answer_for(d, "k")[1].hbm_bytes_free == 4 * GB
    big = answer_for(d, "big")[1]
    assert isinstance(big, NpuAllocFailed)
    assert big.reason == f"out of HBM: region 'kv' asked {5 * GB} bytes, {4 * GB} of {64 * GB} free"
    assert answer_for(d, "f1")[1] == NpuFreeOk(
        req_id="f1", region="kv", nbytes=8 * GB, hbm_bytes_free=12 * GB
    )
    bad = answer_for(d, "f2")[1]
    assert (
        isinstance(bad, NpuError)
        and bad.kind == "bad_request"
        and "'kv' holds 12000000000" in bad.reason
    )
    assert answer_for(d, "f3")[1].nbytes == 40 * GB
    status = answer_for(d, "p")[1]
    assert isinstance(status, NpuStatus)
    assert status.regions == {"kv": 12 * GB} and status.hbm_bytes_free == 52 * GB
    assert_state_is_fold(d, NPU)


def test_crash_fails_running_queued_and_new_requests():
    d = _driver()
    for i in range(3):
        send(d, NPU, _fwd(f"f{i}"))
    send(d, NPU, NpuCrash(reason="ECC storm"), at=0.005)
    send(d, NPU, _fwd("late"), at=0.01)
    send(d, NPU, NpuAlloc(req_id="a", region="kv", nbytes=1), at=0.01)
    send(d, NPU, NpuProbe(req_id="p"), at=0.01)
    d.run()
    for req in ("f0", "f1", "f2", "late", "a", "p"):
        t, msg = answer_for(d, req)
        assert isinstance(msg, NpuError) and msg.kind == "crashed", (req, msg)
        assert "ECC storm" in msg.reason and msg.device == NPU
    assert answer_for(d, "f0")[0] == 0.005  # failed at the crash, not at its completion time
    assert not any(isinstance(m, NpuForwardDone) for _, m in answers(d))
    assert_state_is_fold(d, NPU)


def test_hang_never_answers_asks_time_out_queue_is_bounded_and_reset_recovers():
    d = _driver(queue_limit=3)
    d.spawn("client/0", DevClientLog)
    send(d, "client/0", DevAsk(NPU, _fwd("f0"), 1.0))
    send(d, NPU, NpuHang(), at=0.001)  # f0 is running: it never finishes
    for i in range(1, 6):  # f1..f3 fill the bound; f4, f5 overflow
        send(d, "client/0", DevAsk(NPU, _fwd(f"f{i}"), 1.0), at=0.002)
    send(d, "client/0", DevAsk(NPU, NpuProbe(req_id="p"), 1.0), at=0.002)
    d.run(until=5.0)
    got = d.actor("client/0").state
    # beyond the bound: refused at once; within it: kept, never answered, the asks time out
    assert [(g.kind, g.req_id, g.at_s) for g in got[:3]] == [
        ("NpuError", "f4", 0.002), ("NpuError", "f5", 0.002), ("NpuError", "p", 0.002),
    ]  # fmt: skip
    assert [g.kind for g in got[3:]] == ["AskFailed"] * 4
    assert all(g.detail == "timeout after 1.0s" for g in got[3:])
    st_ = d.actor(NPU).state
    assert st_.status == "hung" and len(st_.queue) == 3 and st_.overflowed == 3
    assert [e.req_id for e in events(d, NPU) if type(e).__name__ == "NpuOverflowed"] == [
        "f4",
        "f5",
        "p",
    ]
    send(d, NPU, NpuAlloc(req_id="w", region="weights", nbytes=GB), at=5.0)  # bound full
    send(d, NPU, NpuReset(), at=6.0)
    send(d, NPU, _fwd("after"), at=7.0)
    d.run()
    t, refused = answer_for(d, "w")
    assert t == 5.0 and isinstance(refused, NpuError) and refused.kind == "queue_full"
    st_ = d.actor(NPU).state
    assert st_.status == "healthy" and st_.regions == {} and st_.queue == ()
    # the reset answers what the hung device had kept; the askers gave up, so the
    # answers are late: recorded (input kind LATE), not delivered (kernel ask contract)
    assert d.actor("client/0").state[7:] == ()
    late = [s.input.type for s in d.sink.steps if s.input.kind == LATE and s.input.actor == "client/0"]
    assert late == ["NpuError"] * 4
    assert isinstance(answer_for(d, "after")[1], NpuForwardDone)
    assert_state_is_fold(d, NPU)


def test_every_request_to_a_hung_npu_is_answered_once_by_the_end():
    """Whatever the bound and however many requests arrive while hung, each one gets exactly
    one answer: refused at once beyond the bound, or failed by the reset."""
    d = _driver(queue_limit=4)
    send(d, NPU, NpuHang())
    reqs = [f"r{i}" for i in range(12)]
    for i, r in enumerate(reqs):
        msg = _fwd(r) if i % 3 else NpuProbe(req_id=r)
        send(d, NPU, msg, at=0.1 + i * 0.01)
    send(d, NPU, NpuReset(), at=10.0)
    d.run()
    kinds = {r: answer_for(d, r)[1].kind for r in reqs}  # exactly one answer each
    assert list(kinds.values()) == ["reset"] * 4 + ["queue_full"] * 8
    assert d.actor(NPU).state.overflowed == 8
    assert_state_is_fold(d, NPU)


def test_reset_loses_hbm_contents_and_records_it():
    d = _driver()
    send(d, NPU, NpuAlloc(req_id="w", region="weights", nbytes=16 * GB))
    send(d, NPU, NpuReset(), at=1.0)
    send(d, NPU, NpuProbe(req_id="p"), at=2.0)
    d.run()
    resets = [e for e in events(d, NPU) if type(e).__name__ == "NpuWasReset"]
    assert [r.hbm_bytes_lost for r in resets] == [16 * GB]
    assert answer_for(d, "p")[1].hbm_bytes_free == 64 * GB


def test_hbm_region_fault_fails_only_what_touches_the_region():
    d = _driver()
    send(d, NPU, NpuAlloc(req_id="w", region="weights", nbytes=GB))
    send(d, NPU, _fwd("run", regions=("weights", "kv")))
    send(d, NPU, _fwd("queued-kv", regions=("weights", "kv")))
    send(d, NPU, _fwd("queued-w", regions=("weights",)))
    send(d, NPU, HbmRegionFault(region="kv"), at=0.001)
    send(d, NPU, NpuAlloc(req_id="a-kv", region="kv", nbytes=GB), at=0.002)
    send(d, NPU, NpuAlloc(req_id="a-w", region="weights", nbytes=GB), at=0.002)
    send(d, NPU, _fwd("new-kv"), at=0.002)
    d.run()
    for req in ("run", "queued-kv", "new-kv"):
        msg = answer_for(d, req)[1]
        assert isinstance(msg, NpuError) and msg.kind == "hbm_fault" and msg.region == "kv", msg
        assert "'kv'" in msg.reason
    assert answer_for(d, "run")[0] == 0.001
    done = answer_for(d, "queued-w")
    assert isinstance(done[1], NpuForwardDone)
    assert done[0] == pytest.approx(0.001 + _model_s(((1, 1000),) * 8))  # starts when "run" aborts
    failed = answer_for(d, "a-kv")[1]
    assert isinstance(failed, NpuAllocFailed) and failed.reason == "HBM region 'kv' is faulted"
    assert isinstance(answer_for(d, "a-w")[1], NpuAllocOk)
    assert_state_is_fold(d, NPU)


def test_reset_can_keep_faulted_regions_masked():
    d = _driver()
    send(d, NPU, HbmRegionFault(region="kv"))
    send(d, NPU, NpuReset(clear_faults=False), at=1.0)
    send(d, NPU, NpuAlloc(req_id="masked", region="kv", nbytes=1), at=2.0)
    send(d, NPU, NpuReset(), at=3.0)
    send(d, NPU, NpuAlloc(req_id="cleared", region="kv", nbytes=1), at=4.0)
    d.run()
    assert isinstance(answer_for(d, "masked")[1], NpuAllocFailed)
    assert isinstance(answer_for(d, "cleared")[1], NpuAllocOk)


def test_bad_forward_is_a_precise_error_not_a_crash():
    d = _driver()
    send(d, NPU, _fwd("m", model="gpt-9"))
    send(d, NPU, _fwd("tp", tp=3))
    d.run()
    assert "unknown model 'gpt-9'" in answer_for(d, "m")[1].reason
    assert answer_for(d, "tp")[1].reason.startswith("tp: 3 does not divide")
    assert handler_failures(d) == []


def _duration(seqs, seed: int = 0, variance: bool = False) -> float:
    d = _driver(seed=seed, variance=variance)
    send(d, NPU, _fwd("x", seqs))
    d.run()
    return answer_for(d, "x")[1].duration_s


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 20000)), min_size=1, max_size=6),
    which=st.integers(0, 5),
    more_new=st.integers(0, 2000),
    more_ctx=st.integers(0, 20000),
)
def test_more_tokens_never_faster(seqs, which, more_new, more_ctx):
    i = which % len(seqs)
    bigger = list(seqs)
    bigger[i] = (seqs[i][0] + more_new, seqs[i][1] + more_ctx)
    assert _duration(tuple(bigger)) >= _duration(tuple(seqs)) * (1 - 1e-12)


def test_seeded_variance_is_deterministic_and_centred_on_the_model():
    seqs = ((1, 1000),) * 8

    def run(seed: int):
        d = _driver(seed=seed, variance=True)
        for i in range(40):
            send(d, NPU, _fwd(f"f{i}", seqs))
        d.run()
        return d, [answer_for(d, f"f{i}")[1].duration_s for i in range(40)]

    (d1, a), (d2, b), (_, c) = run(7), run(7), run(8)
    assert a == b and log_encoding(d1) == log_encoding(d2)
    assert a != c
    ratios = [x / _model_s(seqs) for x in a]
    assert len(set(ratios)) == 40 and 0.85 < sum(ratios) / 40 < 1.15


def test_a_full_graph_queue_refuses_with_a_precise_error():
    d = _driver(queue_limit=2)
    for i in range(4):  # f0 runs, f1 and f2 wait, f3 finds the queue full
        send(d, NPU, _fwd(f"f{i}"))
    send(d, NPU, NpuAlloc(req_id="zero", region="kv", nbytes=0))
    d.run()
    full = answer_for(d, "f3")
    assert full[0] == 0.0 and full[1].kind == "queue_full"
    assert full[1].reason == "graph queue is full (2 waiting)"
    assert all(isinstance(answer_for(d, f"f{i}")[1], NpuForwardDone) for i in range(3))
    assert answer_for(d, "zero")[1].reason == "nbytes: must be > 0, got 0"


def test_start_delay_the_graph_starts_that_long_after_arrival_and_queues_in_one_event():
    """`start_delay_s` (the DP master's launch gap, timed by the device): an idle NPU starts the
    graph at arrival + delay, in one event that queues and starts it; the delay is not queueing."""
    d = _driver()
    seqs = ((1, 1000),) * 8
    delayed = NpuForward(req_id="f0", model="llama3-8b", seqs=tuple(SeqShape(n, c) for n, c in seqs),
                         start_delay_s=0.0005)  # fmt: skip
    send(d, NPU, delayed, at=1.0)
    send(d, NPU, _fwd("f1", seqs), at=1.0001)  # arrives during the delay: waits behind f0
    d.run()
    (t0, m0), (t1, m1) = answer_for(d, "f0"), answer_for(d, "f1")
    expected = _model_s(seqs)
    assert t0 == 1.0 + 0.0005 + expected  # the same float as a start at 1.0005
    assert m0.duration_s == expected and m0.queued_s == 0.0
    assert t1 == pytest.approx(t0 + expected, rel=1e-12)
    assert m1.queued_s == pytest.approx(t0 - 1.0001, rel=1e-12)
    kinds = [type(e).__name__ for e in events(d, NPU) if not e.system]
    # f0 started as it arrived (one event); f1 queued behind it, then started
    assert kinds == ["NpuForwardStarted", "NpuForwardQueued", "NpuForwardEnded",
                     "NpuForwardStarted", "NpuForwardEnded"]  # fmt: skip
    assert_state_is_fold(d, NPU)


def test_start_delay_must_be_finite_and_not_negative():
    d = _driver()
    bad = NpuForward(req_id="b", model="llama3-8b", seqs=(SeqShape(1, 10),), start_delay_s=-1.0)
    send(d, NPU, bad)
    d.run()
    _, err = answer_for(d, "b")
    assert isinstance(err, NpuError) and err.kind == "bad_request"
    assert err.reason == "start_delay_s: must be finite and >= 0, got -1.0"


@given(now=st.floats(0.0, 1e7), ahead=st.floats(0.0, 1e3))
def test_delay_until_fires_exactly_at_the_due_float(now: float, ahead: float):
    from deepserve.adapters.hardware.devices.npu import delay_until

    due = now + ahead
    delay = delay_until(now, due)
    assert delay >= 0.0 and now + delay == due  # what the kernel computes for a timer's due time
