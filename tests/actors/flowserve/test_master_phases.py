"""The DP master's QUEUED and first SCHEDULED times (vLLM's engine events, the start of its queue
and prefill phases) ride in each task's one TaskFinished: queued when the master took the task,
scheduled by the first batch that admitted it — a preempted task's re-admission leaves it. The
time is recorded in the admitting `BatchPlanned` only (`at_s`), so a batch that admits nothing
logs no more than before; replay reproduces every value."""

from __future__ import annotations

from fsharness import assert_replays, events_of
from fswire import task
from test_master import M, finished, run, tokens


def admitted_at(d) -> dict[str, float]:
    """task id -> the `at_s` of the first BatchPlanned that admitted it."""
    out: dict[str, float] = {}
    for p in events_of(d, M, "BatchPlanned"):
        assert (p.at_s is not None) == bool(p.admitted), p  # the time rides only with admissions
        for tid, _ in p.admitted:
            out.setdefault(tid, p.at_s)
    return out


def test_queued_and_first_scheduled_times_are_the_masters() -> None:
    # one task a batch: t1 and t2 wait in the queue while the one before them runs
    d = run([task(0, 300, 5), task(1, 300, 5), task(2, 300, 5)], at=[0.0, 0.01, 0.02], max_num_seqs=1)
    fin, toks, sched = finished(d), tokens(d), admitted_at(d)
    for i, queued in enumerate((0.0, 0.01, 0.02)):
        f = fin[f"t{i}"]
        assert f.queued_s == queued and f.scheduled_s == sched[f"t{i}"], f
        assert f.queued_s <= f.scheduled_s < f.first_token_s == toks[f"t{i}"][0][1]
    assert fin["t0"].scheduled_s == 0.0  # an idle master plans at the arrival
    assert fin["t1"].scheduled_s >= fin["t0"].finish_s  # t1 waited for t0's whole run
    assert fin["t2"].scheduled_s >= fin["t1"].finish_s
    assert_replays(d)


def test_a_preempted_task_keeps_its_first_scheduling_time() -> None:
    ts = [task(i, 256, 300) for i in range(6)]  # 16 blocks hold three: decoding tasks get preempted
    d = run(ts, hbm_blocks=16, max_num_seqs=6)
    fin, sched = finished(d), admitted_at(d)
    readmitted = [tid for p in events_of(d, M, "BatchPlanned") for tid in p.preempted]
    assert readmitted
    later = {}  # a preempted task's later admissions
    for p in events_of(d, M, "BatchPlanned"):
        for tid, _ in p.admitted:
            if p.at_s != sched[tid]:
                later.setdefault(tid, p.at_s)
    assert set(later) == set(readmitted)
    for tid, f in fin.items():
        assert f.status == "completed" and f.scheduled_s == sched[tid] and f.queued_s == 0.0
        assert tid not in later or later[tid] > f.scheduled_s
    assert_replays(d)
