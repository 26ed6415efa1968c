"""A hang under an idle TE, and a crash on a TP group's other NPUs (xDeepServe §6.1: the
heartbeat checks the device; issue 33 §1). The device watch's lease breaks at a hang too, but the
responder's re-probe waits in the hung device's queue and the idle master keeps answering: the
re-probe is therefore bounded by misses x interval (a busy TE's hang bound) and a device silent
that long is declared hung. And the responder watches every NPU of a DP group's TP group, not
only its first.

On the recovery harness's 3-TE cluster (heartbeats every 0.5 s, 3 misses: bound 1.5 s), 2
requests at 1 s (on te/0 and te/1), te/2 idle, 3 requests at 12 s."""

from __future__ import annotations

from recovery_harness import build_run, events

from deepserve.actors.cluster.responder import HbDeviceHung, HbDeviceLost, HbDevicesWatched
from deepserve.actors.cluster.state import TeDeclaredFailed, TeReady

INTERVAL_S, MISSES, FAULT_AT_S = 0.5, 3, 5.2
WATCH = {"heartbeat_device_watch": True}


def _run(control_kw: dict | None, faults: list[dict], **kw):  # noqa: ANN003, ANN202
    return build_run(faults, requests=2, output_tokens=50, again_at_s=12.0, again=3, until_s=25.0,
                     interval_s=INTERVAL_S, misses=MISSES, control_kw=control_kw, **kw)  # fmt: skip


def _declared(d) -> list[tuple[float, str, str]]:  # noqa: ANN001
    return [(round(t - FAULT_AT_S, 6), e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]


def _done(out) -> list[tuple[str, str, int]]:  # noqa: ANN001
    return sorted((m.request_id, m.status, m.output_tokens) for m in out if type(m).__name__ == "RequestDone")


TP4 = {"tp": 4}
HANG = [{"at_s": FAULT_AT_S, "kind": "hang-npu", "target": "hw/s0/npu2"}]


def test_a_hang_under_an_idle_te_is_declared_hung_within_the_bound_and_the_te_replaced() -> None:
    d, out = _run(WATCH, HANG)
    # the lease breaks at 5.2 s; the re-probe is silent for 1.5 s (3 x 0.5 s): hung at 6.7 s, and
    # the next round (7.0 s) answers with the verdict, declared at once
    hung = [(round(t, 6), e.dp, e.reason) for t, e in events(d, "te/2/hb", HbDeviceHung)]
    assert hung == [(6.7, 0, "te/2/dp/0: device hung: hw/s0/npu2: no answer to a probe within 1.5s")]
    assert _declared(d) == [(1.8, "te/2", "hang")]  # within the bound plus one interval
    declared = events(d, "cluster", TeDeclaredFailed)
    assert declared[0][1].at_s == 7.0  # detection time recorded
    ready = [(e.te, e.generation) for t, e in events(d, "cluster", TeReady) if t > FAULT_AT_S]
    assert ready == [("te/2", 2)]  # replaced before the requests at 12 s
    assert _done(out) == [(f"r{i}", "completed", 50) for i in range(5)]


def test_without_the_watch_the_idle_hung_te_stays_ready() -> None:
    """Before: the hang is found only once a request's pass waits on the hung device."""
    d, _ = _run(None, HANG)
    assert events(d, "te/2/hb", HbDeviceHung) == []
    assert _tasks_to(d, "te/2") == [12.1]  # a request's pass waits on the hung device: 8.8 s after the hang
    assert [(t, e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)] == [(14.0, "te/2", "hang")]


def test_a_hang_bound_under_idle_backoff_wakes_the_monitor() -> None:
    """Backed off up to 8 s while idle: the verdict wakes the monitor, declared one base interval later."""
    d, _ = build_run(HANG, requests=2, output_tokens=50, until_s=14.0, interval_s=INTERVAL_S, misses=MISSES,
                     idle_max_s=8.0, control_kw=WATCH)  # fmt: skip
    assert [round(t, 6) for t, _ in events(d, "te/2/hb", HbDeviceHung)] == [6.7]
    assert _declared(d) == [(2.0, "te/2", "hang")]  # 6.7 s + 0.5 s


def test_the_hang_bound_adds_no_delivery_when_nothing_is_wrong() -> None:
    """No fault: the bound rides on the leases, which a healthy device never breaks: the watch
    still costs one probe and one answer per TE (test_idle_crash_sim's 2 x 3), none per round."""
    off, _ = _run(None, [])
    on, _ = _run(WATCH, [])
    assert len(on.sink.steps) - len(off.sink.steps) == 2 * 3


def test_watching_every_npu_of_a_tp_group_costs_two_deliveries_per_npu() -> None:
    """TP 4, no fault: one probe and one answer per NPU (3 TEs x 4) per TE generation, none per round."""
    off, _ = _run(None, [], cluster_kw=TP4)
    on, _ = _run(WATCH, [], cluster_kw=TP4)
    assert len(on.sink.steps) - len(off.sink.steps) == 2 * 3 * 4


def test_every_npu_of_a_tp_group_is_watched_a_crash_on_its_fourth_is_declared() -> None:
    """TP 4: te/2 runs on hw/s1/npu0-3; its fourth NPU crashes while it is idle."""
    crash = [{"at_s": FAULT_AT_S, "kind": "npu-crash", "target": "hw/s1/npu3"}]
    d, out = _run(WATCH, crash, cluster_kw=TP4)
    watched = [e.npus for _, e in events(d, "te/2/hb", HbDevicesWatched)]
    assert watched[0] == ("hw/s1/npu0", "hw/s1/npu1", "hw/s1/npu2", "hw/s1/npu3")  # generation 1's
    lost = [e.reason for _, e in events(d, "te/2/hb", HbDeviceLost)]
    assert lost == ["te/2/dp/0: device lost: hw/s1/npu3: crashed: hw/s1/npu3 crashed: scenario fault at 5.2 s"]
    assert _declared(d) == [(0.3, "te/2", "device-lost")]  # the next round (5.5 s)
    assert len(_tasks_to(d, "te/2")) == 1 and _done(out) == [(f"r{i}", "completed", 50) for i in range(5)]


def test_without_the_watch_a_crash_on_a_tp_groups_fourth_npu_is_never_seen() -> None:
    """As the watch of each group's first NPU only saw it (the test above fails so): the emulated
    TP group runs its graphs on its first NPU, so no pass fails either and te/2 is never declared."""
    crash = [{"at_s": FAULT_AT_S, "kind": "npu-crash", "target": "hw/s1/npu3"}]
    d, _ = _run(None, crash, cluster_kw=TP4)
    assert events(d, "cluster", TeDeclaredFailed) == []


def _tasks_to(d, te: str) -> list[float]:  # noqa: ANN001
    return [s.input.t for s in d.sink.steps if s.input.actor.startswith(f"{te}/dp/") and s.input.type == "SubmitTask"]
