"""An NPU crash under an idle TE (xDeepServe §6.1: the heartbeat checks the device too). A DP
master learns that its device crashed only from a forward pass that fails, so an idle TE on a
crashed NPU answered every heartbeat and stayed ready until a request was routed to it. With
`control.heartbeat_device_watch` each TE's heartbeat responder holds a lease on its NPUs
(actors/cluster/responder.py): the crash breaks it, the responder asks the device, and the next
round's answer says "device lost", so the TE is declared failed within one interval and replaced.

On the recovery harness's 3-TE cluster (heartbeats every 0.5 s, 3 misses), 2 requests at 1 s
(on te/0 and te/1), te/2's NPU crashed at 5.2 s while te/2 is idle, 3 requests at 12 s."""

from __future__ import annotations

from recovery_harness import build_run, events

from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report
from deepserve.actors.cluster.responder import HbDeviceLost
from deepserve.actors.cluster.state import TeDeclaredFailed, TeReady
from deepserve.adapters.scenario.faults import FaultSpec

INTERVAL_S, MISSES, CRASH_AT_S = 0.5, 3, 5.2
WATCH = {"heartbeat_device_watch": True}


def _run(control_kw: dict | None, faults: list[dict] | None = None):  # noqa: ANN202
    faults = [{"at_s": CRASH_AT_S, "kind": "npu-crash", "target": "hw/s0/npu2"}] if faults is None else faults
    return build_run(faults, requests=2, output_tokens=50, again_at_s=12.0, again=3, until_s=25.0,
                     interval_s=INTERVAL_S, misses=MISSES, control_kw=control_kw)  # fmt: skip


def _tasks_to(d, te: str) -> list[float]:  # noqa: ANN001
    return [s.input.t for s in d.sink.steps if s.input.actor.startswith(f"{te}/dp/") and s.input.type == "SubmitTask"]


def test_a_crash_under_an_idle_te_is_declared_within_one_interval_and_the_te_replaced() -> None:
    d, out = _run(WATCH)
    assert [t for t in _tasks_to(d, "te/2") if t < 12.0] == []  # idle when its NPU crashed
    declared = [(round(t - CRASH_AT_S, 6), e.te, e.diagnosis, e.at_s) for t, e in events(d, "cluster", TeDeclaredFailed)]
    assert [(after, te, why) for after, te, why, _ in declared] == [(0.3, "te/2", "device-lost")]  # the round at 5.5 s
    assert declared[0][0] <= INTERVAL_S and declared[0][3] == 5.5  # detection time recorded
    lost = [e.reason for _, e in events(d, "te/2/hb", HbDeviceLost)]
    assert lost == ["te/2/dp/0: device lost: hw/s0/npu2: crashed: hw/s0/npu2 crashed: scenario fault at 5.2 s"]
    ready = [(e.te, e.generation) for t, e in events(d, "cluster", TeReady) if t > CRASH_AT_S]
    assert ready == [("te/2", 2)]  # replaced before the requests at 12 s
    assert len(_tasks_to(d, "te/2")) == 1  # one of them served by the replacement
    crash = FaultSpec(at_s=CRASH_AT_S, kind="npu-crash", target="hw/s0/npu2")
    npus = {f"te/{i}": (f"hw/s0/npu{i}",) for i in range(3)}
    r = recovery_report([crash], recovery_events(d.sink.steps), npus, until_s=d.now)
    assert [ln.text() for ln in r.lines] == ["fault at 5.2 s: npu-crash hw/s0/npu2 (te/2): detected after 0.3 s "
                                             "(device-lost), recovered after 6.87 s; requests: 0 failed, 0 retried"]
    done = [m for m in out if type(m).__name__ == "RequestDone"]
    assert sorted((m.request_id, m.status, m.output_tokens) for m in done) == [(f"r{i}", "completed", 50) for i in range(5)]


def test_without_the_watch_the_idle_te_stays_ready_on_its_crashed_npu() -> None:
    """The gap the watch closes (and old logs' behaviour, which the setting keeps when off)."""
    d, _ = _run(None)
    assert _tasks_to(d, "te/2") == [12.1]  # a request routed to it: its pass fails, the master learns
    declared = [(t, e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]
    assert declared == [(12.5, "te/2", "device-lost")]  # 7.3 s after the crash, not within one interval


def test_the_watch_costs_two_deliveries_per_te_not_per_round() -> None:
    """No fault: the same run with the watch on delivers one probe and one answer per TE more."""
    off, _ = _run(None, [])
    on, _ = _run(WATCH, [])
    assert len(on.sink.steps) - len(off.sink.steps) == 2 * 3


def test_a_monitor_backed_off_while_idle_is_woken_by_the_crash() -> None:
    """Idle backoff (the daemon's, up to 8 s here): the rounds are far apart by 5.2 s; the watch
    wakes the monitor, so the TE is still declared within one base interval."""
    d, _ = build_run([{"at_s": CRASH_AT_S, "kind": "npu-crash", "target": "hw/s0/npu2"}], requests=2, output_tokens=50,
                     until_s=12.0, interval_s=INTERVAL_S, misses=MISSES, idle_max_s=8.0, control_kw=WATCH)  # fmt: skip
    declared = [(round(t - CRASH_AT_S, 6), e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]
    assert declared == [(0.5, "te/2", "device-lost")]


def test_a_whole_hbm_region_faulted_under_an_idle_te_is_declared_as_a_crash_is() -> None:
    """A fault the TE cannot do without (health.classify_hbm: a whole region) ends it as a crash
    does; a part of the KV region (masked in place, or failing only what touches it) does not."""
    whole = {"at_s": CRASH_AT_S, "kind": "hbm-fault", "target": "hw/s0/npu2", "region": "kv"}
    d, _ = _run(WATCH, [whole])
    declared = [(round(t - CRASH_AT_S, 6), e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]
    assert declared == [(0.3, "te/2", "device-lost")]
    assert [e.reason for _, e in events(d, "te/2/hb", HbDeviceLost)] == [
        "te/2/dp/0: device lost: hw/s0/npu2: hbm_fault: HBM regions faulted: kv"]
    part = {**whole, "span": (0.0, 0.25)}
    d, _ = _run(WATCH, [part])
    assert events(d, "te/2/hb", HbDeviceLost) == []
    # left to the pass that touches it (masking is off here: a request's pass at 12 s fails)
    assert [t for t, _ in events(d, "cluster", TeDeclaredFailed)] == [12.5]
