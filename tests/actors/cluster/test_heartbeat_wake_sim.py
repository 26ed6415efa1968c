"""Idle backoff in a simulation (recovery_harness.py's cluster): heartbeats double their interval
while every TE is idle (up to 60 s), so an idle simulated hour costs a few rounds; the gateway
wakes the monitor when requests come back after a quiet spell (`GatewayConfig.wake`), so a TE
killed while idle is found as fast as under load once traffic returns — not at the next far
tick. 12 requests from t=1 s, te/1 killed at 50 s, 12 more from t=100 s."""

from __future__ import annotations

from collections import Counter
from typing import Any

from recovery_harness import build_run, events

from deepserve.actors.cluster.heartbeat import HbTicked, HbWoken
from deepserve.actors.cluster.state import TeDeclaredFailed
from deepserve.actors.workload.messages import RequestDone
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

RUN: dict[str, Any] = {"requests": 12, "gap_s": 0.1, "output_tokens": 50, "until_s": 200.0, "interval_s": 1.0,
                       "idle_max_s": 60.0, "again_at_s": 100.0}  # fmt: skip
KILL = [{"at_s": 50.0, "kind": "kill-te", "target": "te/1"}]


def declared(d: Any) -> list[tuple[float, str, str]]:
    return [(t, e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]


def test_without_a_wake_the_kill_waits_for_the_far_tick() -> None:
    d, _ = build_run(KILL, **RUN)
    ticks = [t for t, _ in events(d, "cluster/heartbeat", HbTicked)]
    assert [t for t in ticks if 60 < t < 133] == [70.0, 130.0, 131.0, 132.0]  # 70 -> 130: backed off to 60 s
    assert declared(d) == [(132.0, "te/1", "silent")]


def test_the_gateway_wakes_the_monitor_when_requests_return() -> None:
    d, out = build_run(KILL, **RUN, wake=True)
    assert [t for t, _ in events(d, "cluster/heartbeat", HbWoken)] == [1.0, 100.0]
    assert declared(d) == [(103.0, "te/1", "silent")]  # ticks at 101, 102, 103: three misses
    assert Counter(m.status for m in out if isinstance(m, RequestDone)) == Counter(completed=24)
    ticks = [t for t, _ in events(d, "cluster/heartbeat", HbTicked)]
    assert len(ticks) == 19  # 200 s of virtual time; at a fixed 1 s interval it would be 200
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
