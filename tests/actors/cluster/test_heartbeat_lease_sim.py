"""Heartbeat leases (`control.heartbeat_lease_s`, actors/cluster/heartbeat.py) on the recovery
harness's 3-TE cluster, aggregated decode runs on: an ok answer whose NPUs promised word of any
fault is not asked again for the lease, so a fault-free run costs a few rounds instead of one a
TE and interval — and the detection bounds stay: a hang within misses x interval of it, a
crash at the first round after it (device lost), a killed pod by its silence, heartbeat loss by
the monitor's rules."""

from __future__ import annotations

from collections import Counter
from typing import Any

from recovery_harness import build_run, events

from deepserve.actors.cluster.heartbeat import HbLeaseBroken, HbTicked, HbWatch, HbWoken
from deepserve.actors.cluster.state import TeDeclaredFailed
from deepserve.actors.workload.messages import RequestDone
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

RUN: dict[str, Any] = {"requests": 120, "gap_s": 0.5, "output_tokens": 100, "until_s": 100.0, "interval_s": 1.0,
                       "aggregate": True, "lease_s": 30.0}  # fmt: skip


def pings(d: Any) -> int:
    return sum(len(e.pinged) for _, e in events(d, "cluster/heartbeat", HbTicked))


def declared(d: Any) -> list[tuple[float, str, int, str]]:
    return [(t, e.te, e.generation, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]


def test_a_leased_cluster_is_asked_once_a_lease_not_once_an_interval() -> None:
    d, out = build_run([], **RUN)
    plain, _ = build_run([], **{**RUN, "lease_s": 0.0})
    assert Counter(m.status for m in out if isinstance(m, RequestDone)) == Counter(completed=120)
    assert [te for _, e in events(d, "cluster/heartbeat", HbTicked) for te, _, _ in e.missed] == []
    # 100 s, 3 TEs: a round a TE every 30 s (4 each) against one a second (~99 each)
    assert pings(d) <= 12 < 250 < pings(plain)
    ticks = events(d, "cluster/heartbeat", HbTicked)
    assert len(ticks) <= 8  # every TE leased: the next tick is at the first lease's end
    assert d.deliveries < plain.deliveries - 1000
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_hang_inside_a_lease_is_found_within_misses_intervals() -> None:
    d, out = build_run([{"at_s": 20.0, "kind": "hang-npu", "target": "hw/s0/npu1"}], **RUN)
    broken = events(d, "cluster/heartbeat", HbLeaseBroken)
    assert [(t, e.te, e.soon) for t, e in broken] == [(20.0, "te/1", True)]
    # the lease broken at 20: asked at 21 (its NPU does not answer), misses at 22, 23; the stall
    # counts from the round before the break, so 3 rounds later it is declared (issue 31 §2)
    assert declared(d) == [(23.0, "te/1", 1, "hang")]
    assert declared(d)[0][0] - 20.0 <= 3 * 1.0
    assert Counter(m.status for m in out if isinstance(m, RequestDone)) == Counter(completed=119, failed=1)
    assert d.actor("cluster").state.tes["te/1"].generation == 2
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_crash_inside_a_lease_is_declared_at_the_next_round() -> None:
    d, _ = build_run([{"at_s": 20.0, "kind": "npu-crash", "target": "hw/s0/npu1"}], **RUN)
    assert [t for t, _ in events(d, "cluster/heartbeat", HbLeaseBroken)] == [20.0]
    got = declared(d)
    assert [(te, gen, why) for _, te, gen, why in got] == [("te/1", 1, "device-lost")]
    assert 20.0 < got[0][0] <= 21.0 + 0.5  # the round of 21 answers "device lost"
    assert d.actor("cluster").state.tes["te/1"].generation == 2


def test_a_killed_pod_voids_its_lease_and_is_found_by_its_silence() -> None:
    d, _ = build_run([{"at_s": 20.0, "kind": "kill-te", "target": "te/1"}], **RUN)
    assert [(t, e.te) for t, e in events(d, "cluster/heartbeat", HbLeaseBroken)] == [(20.0, "te/1")]
    assert declared(d) == [(24.0, "te/1", 1, "silent")]


def test_heartbeat_loss_breaks_the_lease_and_the_rules_decide() -> None:
    d, _ = build_run([{"at_s": 20.0, "kind": "heartbeat-loss", "target": "te/1", "duration_s": 10.0}], **RUN)
    assert [(t, e.te) for t, e in events(d, "cluster/heartbeat", HbLeaseBroken)] == [(20.0, "te/1")]
    assert declared(d) == [(24.0, "te/1", 1, "silent")]


def test_a_replacement_watched_while_the_others_are_leased_is_asked_within_an_interval() -> None:
    d, _ = build_run([{"at_s": 20.0, "kind": "kill-te-process", "target": "te/1"}], **RUN)
    assert declared(d) == [(20.0, "te/1", 1, "exited")]
    watched = [t for t, e in events(d, "cluster/heartbeat", HbWatch) if e.te == "te/1" and e.generation == 2]
    first = next(t for t, e in events(d, "cluster/heartbeat", HbTicked) if t >= watched[0] and "te/1" in e.pinged)
    assert first <= watched[0] + 1.0  # not at the others' lease end (the far tick)
    assert events(d, "cluster/heartbeat", HbWoken)[-1][0] == watched[0]
