"""The simulation fast path: a pure-decode batch runs as one NpuForwardRun; arrivals truncate it.
Per-task token timings equal the stepwise path's, and the log alone rebuilds them."""

from __future__ import annotations

import msgspec
import pytest
from fsharness import assert_replays, driver, events_of, out_to
from fswire import REQ, hardware, master_config, task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_master import finished, tokens

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.master.scheduler import PROBE_RUN_PASSES
from deepserve.actors.flowserve.master.state import MasterConfig
from deepserve.actors.flowserve.master.timeline import token_timeline
from deepserve.actors.flowserve.messages import CancelTask, TaskTokens
from deepserve.actors.ports.npu import NpuForwardRun
from deepserve.core.codec import decode

M = "te/0/dp/0"


def _run(aggregate: bool, n: int = 14, cancel: bool = True):
    d = driver(seed=3)
    hardware(d)
    cfg = master_config(aggregate=aggregate, hbm_blocks=400, max_num_seqs=8)
    d.spawn(M, DpMaster, config=cfg)
    for i in range(n):  # staggered arrivals: runs get truncated at every one
        t = task(i, 200 + 450 * (i % 4), 30 + 17 * (i % 5))
        d.inject(M, t, at=0.05 * i + 0.013 * (i % 3), src=REQ)
    if cancel:
        d.inject(M, CancelTask(task_id="t5"), at=0.9, src=REQ)
    d.run()
    return d, msgspec.convert(cfg, MasterConfig)


def test_aggregated_and_stepwise_give_the_same_token_times() -> None:
    step_d, _ = _run(False)
    agg_d, cfg = _run(True)
    step_t, agg_t = tokens(step_d), tokens(agg_d)
    assert sorted(step_t) == sorted(agg_t)
    for tid in step_t:
        s, a = step_t[tid], agg_t[tid]
        assert [x for x, _ in s] == [x for x, _ in a], tid  # the same token ids
        assert [t for _, t in a] == pytest.approx([t for _, t in s], abs=1e-9, rel=0), tid
    fs, fa = finished(step_d), finished(agg_d)
    assert {k: (v.status, v.output_tokens) for k, v in fs.items()} == {
        k: (v.status, v.output_tokens) for k, v in fa.items()
    }
    assert fa["t5"].status == "cancelled"
    # the point of it: far fewer NPU requests and master deliveries
    runs = events_of(agg_d, "hw/s0/npu0", "NpuRunStarted")
    assert runs and len(agg_d.sink.steps) < len(step_d.sink.steps) / 3
    truncated = [e for e in events_of(agg_d, "hw/s0/npu0", "NpuRunTruncated")]
    assert truncated  # arrivals cut runs short
    # the log alone rebuilds every token's time (what replay / reports rely on)
    rebuilt = token_timeline(cfg, [e for e in events_of(agg_d, M) if not e.system])
    streamed = {tid: [t for _, t in v] for tid, v in agg_t.items()}
    assert rebuilt == streamed
    sent = sum(len(m.token_ids) for _, m in out_to(agg_d, REQ) if isinstance(m, TaskTokens))
    assert sent == sum(len(v) for v in rebuilt.values())
    assert_replays(agg_d)
    assert_replays(step_d)

_REQS = st.lists(
    st.tuples(st.floats(0.0, 1.5), st.integers(1, 3000), st.integers(1, 120), st.booleans()),
    min_size=1, max_size=10,
)  # fmt: skip


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_REQS, st.integers(1, 6), st.sampled_from([512, 2048]))
def test_any_workload_has_the_same_token_times_on_both_paths(reqs, max_seqs, budget) -> None:
    """Random arrivals, prompt and output lengths, cancels, batch limits and token budgets."""

    def one(aggregate: bool):
        d = driver(seed=9)
        hardware(d)
        d.spawn(M, DpMaster, config=master_config(aggregate=aggregate, max_num_seqs=max_seqs,
                                                  max_num_batched_tokens=budget))  # fmt: skip
        for i, (at, prompt, out, cancel) in enumerate(reqs):
            d.inject(M, task(i, prompt, out), at=at, src=REQ)
            if cancel:
                d.inject(M, CancelTask(task_id=f"t{i}"), at=at + 0.3, src=REQ)
        d.run()
        return d

    s, a = one(False), one(True)
    ts, ta = tokens(s), tokens(a)
    assert ts.keys() == ta.keys()
    for tid in ts:
        assert [x for x, _ in ts[tid]] == [x for x, _ in ta[tid]]
        assert [t for _, t in ta[tid]] == pytest.approx([t for _, t in ts[tid]], abs=1e-9, rel=0)
    fs, fa = finished(s), finished(a)
    assert {k: (v.status, v.output_tokens) for k, v in fs.items()} == {
        k: (v.status, v.output_tokens) for k, v in fa.items()
    }
    assert len(fa) == len(reqs)


def test_a_run_longer_than_the_npu_timeout_is_split_and_never_times_out() -> None:
    """A decode run's expected length stays under a share of the NPU ask timeout (and the ask
    waits for that length on top), so a long output on a healthy NPU never fails: the heatmap's
    4096-in x 4096-out cell used to hit the 120 s ask timeout with one 4096-pass run."""
    timeout_s = 1.0
    d = driver(seed=5)
    hardware(d)
    d.spawn(M, DpMaster, config=master_config(aggregate=True, npu_timeout_s=timeout_s))
    d.inject(M, task(0, 4096, 1500), at=0.0, src=REQ)
    d.run()
    done = finished(d)["t0"]
    assert (done.status, done.output_tokens) == ("completed", 1500)
    assert done.finish_s - done.first_token_s > 5 * timeout_s  # much longer than one timeout
    runs = [e.ends_s for e in events_of(d, M, "BatchEnded") if len(e.ends_s) > 1]
    assert len(runs) > 5  # split into runs that each fit the timeout
    assert runs[0][-1] - runs[0][0] < timeout_s  # the first: a short probe, not yet timed
    for ends in runs[1:]:  # then each is expected to last <= 1/4 of the timeout
        assert ends[-1] - ends[0] < 0.3 * timeout_s
    assert_replays(d)


def test_a_task_submitted_without_stream_gets_only_its_terminal_message() -> None:
    """`stream=False` (what `deepserve sim`'s workload asks): no TaskAccepted, no TaskTokens; the
    timings come with TaskFinished and the log still rebuilds every token's time."""
    d = driver(seed=4)
    hardware(d)
    cfg = master_config(aggregate=True)
    d.spawn(M, DpMaster, config=cfg)
    d.inject(M, task(0, 700, 40, stream=False), at=0.0, src=REQ)
    d.inject(M, task(1, 300, 25, stream=False), at=0.2, src=REQ)  # truncates the first's run
    d.run()
    sent = [m for _, m in out_to(d, REQ)]
    assert {type(m).__name__ for m in sent} == {"TaskFinished"}
    done = finished(d)
    timeline = token_timeline(msgspec.convert(cfg, MasterConfig), [e for e in events_of(d, M) if not e.system])
    for tid, out in (("t0", 40), ("t1", 25)):
        assert (done[tid].status, done[tid].output_tokens) == ("completed", out)
        times = timeline[tid]
        assert len(times) == out
        assert (times[0], times[-1]) == (done[tid].first_token_s, done[tid].finish_s)
    assert_replays(d)


def _alone(aggregate: bool):
    d = driver(seed=3)
    hardware(d)
    cfg = master_config(aggregate=aggregate, hbm_blocks=400, max_num_seqs=8)
    d.spawn(M, DpMaster, config=cfg)
    d.inject(M, task(0, 700, 40), at=0.0, src=REQ)
    d.run()
    return d


def test_a_prompt_completed_in_a_pass_and_its_decode_are_one_run() -> None:
    # The prompt fits the token budget: its prefill is pass 0 (the head) of the run that decodes
    # it, so the NPU gets runs only, not a forward and then a run.
    agg, step = _alone(True), _alone(False)
    asked = [decode(s.input.type, s.input.payload) for s in agg.sink.steps
             if s.input.actor == "hw/s0/npu0" and s.input.type.startswith("NpuForward")]  # fmt: skip
    first = asked[0]
    assert isinstance(first, NpuForwardRun) and first.iterations == PROBE_RUN_PASSES, first
    assert [(s.new_tokens, s.context_tokens) for s in first.head] == [(700, 0)]
    assert [(s.new_tokens, s.context_tokens) for s in first.seqs] == [(1, 700)]
    assert all(isinstance(m, NpuForwardRun) and not m.head for m in asked[1:]) and len(asked) > 1
    step_t, agg_t = tokens(step), tokens(agg)
    assert agg_t.keys() == step_t.keys() == {"t0"} and len(agg_t["t0"]) == 40
    # the same token times as a forward and then one pass at a time
    assert [t for _, t in agg_t["t0"]] == pytest.approx([t for _, t in step_t["t0"]], abs=1e-9, rel=0)
    # the prefill rate is learned from the head pass as from a forward (to the float's last bits)
    a, s = agg.actor(M).state.prefill_tokens_per_s, step.actor(M).state.prefill_tokens_per_s
    assert a == pytest.approx(s, rel=1e-12) and a != 2.0e4  # MasterConfig's starting estimate
    assert_replays(agg)


def test_a_long_prompt_is_prefilled_in_the_lead_of_the_run_that_decodes_it() -> None:
    """Chunked prefill in a run: a prompt of five 512-token chunks beside a decoding task is
    one NPU request (pass 0, four lead passes that finish the prompt, then decodes), where the
    stepwise path sends a forward a chunk; every token comes at the same time on both paths,
    and the log alone rebuilds them."""

    def one(aggregate: bool):
        d = driver(seed=11)
        hardware(d)
        cfg = master_config(aggregate=aggregate, max_num_batched_tokens=512)
        d.spawn(M, DpMaster, config=cfg)
        d.inject(M, task(0, 300, 60), at=0.0, src=REQ)
        d.inject(M, task(1, 2500, 30), at=0.05, src=REQ)  # arrives while t0 decodes
        d.run()
        return d, msgspec.convert(cfg, MasterConfig)

    (step_d, _), (agg_d, cfg) = one(False), one(True)
    st, at = tokens(step_d), tokens(agg_d)
    for tid in ("t0", "t1"):
        assert [t for _, t in at[tid]] == pytest.approx([t for _, t in st[tid]], abs=1e-9, rel=0), tid
    plans = [e for e in events_of(agg_d, M, "BatchPlanned") if e.lead]
    assert len(plans) == 1
    (plan,) = plans
    # pass 0 takes t0's decode and 511 prompt tokens; each lead pass t0's decode and 511 more
    assert [e.n for e in plan.entries] == [1, 511]
    assert [[x.n for x in p] for p in plan.lead] == [[1, 511]] * 3 + [[1, 456]]  # 2,500 = 4 x 511 + 456
    assert plan.emit_from == (0, 4)  # t1's first token ends pass 4
    def forwards(d) -> int:
        return sum(1 for s in d.sink.steps if s.input.actor == "hw/s0/npu0" and s.input.type == "NpuForward")

    assert forwards(agg_d) == 0  # no chunk was a forward of its own
    assert forwards(step_d) > 5 * len(events_of(agg_d, "hw/s0/npu0", "NpuRunStarted"))
    rebuilt = token_timeline(cfg, [e for e in events_of(agg_d, M) if not e.system])
    assert rebuilt == {tid: [t for _, t in v] for tid, v in at.items()}
    assert_replays(agg_d)
