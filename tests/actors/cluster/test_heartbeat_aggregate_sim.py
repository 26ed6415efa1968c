"""Heartbeats with the simulator's aggregated decode fast path (`cluster.scheduler.aggregate`):
a master inside a run (one NPU request standing for many passes) is busy, not stuck — its
responder probes the NPU, which answers while it works; a hung NPU still does not, and the TE is
declared failed after the same misses as without aggregation (recovery_harness.py's cluster)."""

from __future__ import annotations

from collections import Counter

from recovery_harness import build_run, events

from deepserve.actors.cluster.heartbeat import HbTicked
from deepserve.actors.cluster.responder import HbProbing
from deepserve.actors.cluster.state import TeDeclaredFailed
from deepserve.actors.workload.messages import RequestDone
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

RUN = {"requests": 120, "gap_s": 0.5, "output_tokens": 100, "until_s": 100.0, "interval_s": 1.0, "aggregate": True}


def test_busy_masters_inside_runs_miss_no_heartbeat() -> None:
    d, out = build_run([], **RUN)
    misses = [(t, te) for t, e in events(d, "cluster/heartbeat", HbTicked) for te, _, _ in e.missed]
    assert misses == []  # before: 37 misses, te/2 twice in a row (a third and it was "failed")
    probes = [e for te in ("te/0", "te/1", "te/2") for _, e in events(d, f"{te}/hb", HbProbing)]
    assert len(probes) > 10  # runs did span heartbeats: their NPUs were asked instead
    assert Counter(m.status for m in out if isinstance(m, RequestDone)) == Counter(completed=120)
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_hung_npu_inside_a_run_is_still_found() -> None:
    d, out = build_run([{"at_s": 20.0, "kind": "hang-npu", "target": "hw/s0/npu1"}], **RUN)
    declared = events(d, "cluster", TeDeclaredFailed)
    # within misses x interval of the hang (issue 31 §2): 3 rounds after its last answer at 20 s
    assert [(t, e.te, e.generation, e.diagnosis) for t, e in declared] == [(23.0, "te/1", 1, "hang")]
    assert "te/1/dp/0 is inside a run its NPU hw/s0/npu1 does not answer" in declared[0][1].reason
    misses = [(t, te, n) for t, e in events(d, "cluster/heartbeat", HbTicked) for te, n, _ in e.missed]
    assert misses == [(22.0, "te/1", 1), (23.0, "te/1", 2)]
    assert Counter(m.status for m in out if isinstance(m, RequestDone)) == Counter(completed=119, failed=1)
    assert d.actor("cluster").state.tes["te/1"].generation == 2
