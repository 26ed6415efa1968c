"""The recovery ladder's rungs on the same fault, in virtual time (benchmarks/recovery.py's cluster:
2 prefill TEs on server 0, 2 decode TEs on server 1, one spare server 2; the first 60 requests
of the Azure conversation trace; decode te/2's NPU crashes at 20 s): what each rung did, the
numbers it scored, and every log replays identically."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.ladder import (
    LadderChose,
    LadderState,
    NodeRepaired,
    NodeTainted,
    TeRelocated,
    WorldRestarted,
)
from deepserve.actors.cluster.state import (
    CmState,
    GroupTarget,
    MembershipPushed,
    TeLaunching,
    TeReady,
    TeStopped,
)
from deepserve.benchmarks.recovery import FAULT_AT_S, Run, _cell, config, simulate
from deepserve.cluster.control import MANAGER_ADDR
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

REQUESTS = 60
LADDER = (LadderChose, NodeTainted, TeRelocated, WorldRestarted)
REPAIR_AT_S = FAULT_AT_S + 60.0  # recovery.node_repair_s's default


def events(run: Run, *classes: type) -> list[tuple[float, Any]]:
    names = {c.__name__ for c in classes}
    return [(s.input.t, decode(e.type, e.payload)) for s in run.sink.steps if s.input.actor == MANAGER_ADDR
            for e in s.events if e.type in names]  # fmt: skip


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    return {rung: simulate(rung, "npu-crash", REQUESTS) for rung in ("replace", "restart-world", "pd-separate",
                                                                     "substitute")}  # fmt: skip


def cell(runs: dict[str, Run], rung: str) -> Any:
    r = runs[rung]
    return _cell(rung, "npu-crash", r.requests, r.done, r.sink, r.wall_s)


def slot_npus(run: Run, te: str) -> tuple[str, ...]:
    (launch,) = [e for _, e in events(run, TeLaunching) if e.te == te and e.generation == 2]
    assert launch.replacing
    pods = run.driver.actor("pods").state.pods
    return pods[launch.pod_id].launch.slot.npus  # type: ignore[no-any-return]


def test_replace_is_today_s_rung_and_records_no_ladder_event(runs: dict[str, Run]) -> None:
    r = runs["replace"]
    assert type(r.driver.actor(MANAGER_ADDR).state) is CmState
    assert events(r, *LADDER) == []
    c = cell(runs, "replace")
    assert (c.detected_s, c.diagnosis, c.serving_min) == (0.0, "device-lost", 3)
    assert c.recovered_s == pytest.approx(6.567, abs=1e-3)
    assert (c.affected, c.failed, c.recomputed, c.completed) == (3, 0, 3, REQUESTS)
    assert slot_npus(r, "te/2") == ("hw/s1/npu0",)  # its own slot


def test_substitute_boots_exactly_the_failed_decode_on_the_spare_server(runs: dict[str, Run]) -> None:
    r = runs["substitute"]
    assert type(r.driver.actor(MANAGER_ADDR).state) is LadderState
    assert [e.server for _, e in events(r, NodeTainted)] == [1]
    assert slot_npus(r, "te/2") == ("hw/s2/npu0",)
    assert [e.te for _, e in events(r, TeLaunching) if e.replacing] == ["te/2"]  # minimum cost: one instance
    assert events(r, TeStopped) == []
    # routing follows registration: the JEs' membership has te/2 again only once it is ready
    (back,) = [t for t, e in events(r, TeReady) if e.te == "te/2" and e.generation == 2]
    pushes = [(t, "te/2" in e.tes) for t, e in events(r, MembershipPushed) if e.group == "llama3-8b/decode"]
    assert [has for t, has in pushes if t >= FAULT_AT_S] == [False, True]
    assert next(t for t, has in pushes if t > FAULT_AT_S and has) == back
    c = cell(runs, "substitute")
    assert c.serving_min == 3 and c.recovered_s == pytest.approx(6.567, abs=1e-3)
    assert (c.failed, c.completed) == (0, REQUESTS) and "spare server s2" in c.choice


def test_pd_separate_kills_a_prefill_to_preserve_the_decode(runs: dict[str, Run]) -> None:
    r = runs["pd-separate"]
    assert [(e.te, e.reason.split(":")[0]) for _, e in events(r, TeStopped)] == [("te/1", "kill-P-to-preserve-D")]
    assert slot_npus(r, "te/2") == ("hw/s0/npu1",)  # te/1's NPU
    c = cell(runs, "pd-separate")
    assert c.serving_min == 2 and c.recovered_s == pytest.approx(6.567, abs=1e-3)
    assert c.whole_s == pytest.approx(60 + 6.567, abs=1e-3)  # te/1 back after the repair and its boot
    targets = [(t, e.size) for t, e in events(r, GroupTarget) if e.group == "llama3-8b/prefill" and t > 0]
    assert targets == [(FAULT_AT_S, 1), (REPAIR_AT_S, 2)]  # one prefill fewer until the node's repair
    # repaired, server 1 takes te/1 back, on the NPU te/2 left: the cluster whole again
    assert [e.server for _, e in events(r, NodeRepaired)] == [1] and slot_npus(r, "te/1") == ("hw/s1/npu0",)
    st = r.driver.actor(MANAGER_ADDR).state
    assert {x.state for x in st.tes.values()} == {"ready"} and st.tainted == {} and st.down == {}


def test_restart_world_restarts_every_te_decode_before_prefill(runs: dict[str, Run]) -> None:
    r = runs["restart-world"]
    (restart,) = [e for _, e in events(r, WorldRestarted)]
    assert restart.stopped == ("te/0", "te/1", "te/2", "te/3") and restart.queued == ("te/0",)
    ready = {e.te: t for t, e in events(r, TeReady) if FAULT_AT_S < t < REPAIR_AT_S}
    launched = {e.te: t for t, e in events(r, TeLaunching) if FAULT_AT_S < t < REPAIR_AT_S}
    assert set(ready) == {"te/0", "te/2", "te/3"}  # te/1 gave its NPUs to te/2 (its node is tainted)
    assert launched["te/0"] == max(ready["te/2"], ready["te/3"]) and ready["te/0"] > launched["te/0"]
    c = cell(runs, "restart-world")
    assert c.serving_min == 0 and c.recovered_s == pytest.approx(ready["te/0"] - FAULT_AT_S)
    assert c.recovered_s > cell(runs, "replace").recovered_s
    assert c.failed > 0 and c.completed == REQUESTS - c.failed  # nothing serves while the world restarts


def test_every_rung_s_log_replays_identically(runs: dict[str, Run]) -> None:
    for rung, r in runs.items():
        assert verify(MemoryLog(r.sink)).identical, rung  # type: ignore[arg-type]


def test_replay_why_shows_the_rung_s_choice_for_a_request_on_the_failed_te(runs: dict[str, Run]) -> None:
    from deepserve.replay.why import request_hops, why_lines

    r = runs["pd-separate"]
    hit = sorted(e.request_id for _, e in events_of(r, "JeTaskEnded") if e.te == "te/2" and e.status == "failed")
    assert hit
    story = list(why_lines(request_hops(MemoryLog(r.sink), hit[0])))  # type: ignore[arg-type]
    declared = next(i for i, ln in enumerate(story) if "te/2 generation 1 declared failed (device-lost)" in ln)
    assert ("CONTROL cluster: recovery ladder (pd-separate) for te/2 generation 1: kill-P-to-preserve-D: "
            "te/1's NPUs on s0 host decode te/2") in story[declared + 1]  # fmt: skip


def events_of(run: Run, name: str) -> list[tuple[float, Any]]:
    return [(s.input.t, decode(e.type, e.payload)) for s in run.sink.steps for e in s.events if e.type == name]


def test_decode_vertical_scaling_keeps_the_other_dp_group_s_requests() -> None:
    # te/2 with 2 DP groups (hw/s1/npu0, npu1); dp/1's NPU crashes at 20 s
    cells, tasks = {}, {}
    for rung in ("replace", "pd-separate"):
        r = simulate(rung, "dp-npu-crash", REQUESTS)
        cells[rung] = _cell(rung, "dp-npu-crash", r.requests, r.done, r.sink, r.wall_s)
        tasks[rung] = {e.task_id for _, e in events_of(r, "JeTaskEnded") if e.te == "te/2" and e.status == "failed"}
        if rung == "pd-separate":
            assert r.driver.actor(MANAGER_ADDR).state.tes["te/2"].generation == 1  # never replaced
            assert r.driver.actor("te/2/hb").state.dropped == [1]
            assert [(e.dp, e.dps_left) for _, e in events_of(r, "TeScaledIn")] == [(1, 1)]
            assert events_of(r, "TeDeclaredFailed") == []
            assert verify(MemoryLog(r.sink)).identical  # type: ignore[arg-type]
    base, vs = cells["replace"], cells["pd-separate"]
    assert (vs.detected_s, vs.diagnosis, vs.serving_min, vs.failed) == (0.0, "scaled in", 4, 0)
    # only dp/1's tasks failed over; the TE replaced whole fails dp/0's too
    assert tasks["pd-separate"] < tasks["replace"] and vs.affected < base.affected


def test_the_recovery_report_line_of_a_scaled_in_decode() -> None:
    from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report

    r = simulate("pd-separate", "dp-npu-crash", REQUESTS)
    cfg = config("pd-separate", "dp-npu-crash", REQUESTS, 0)
    npus = {"te/2": ("hw/s1/npu0", "hw/s1/npu1")}
    (line,) = recovery_report(cfg.faults, recovery_events(r.sink.steps), npus).lines  # type: ignore[arg-type]
    assert line.text() == ("fault at 20 s: npu-crash hw/s1/npu1 (te/2): detected after 0 s (scaled in: dp/1 "
                           "dropped, 1 left), recovered after 0 s; requests: 0 failed, 2 retried")  # fmt: skip


def test_the_recovery_report_of_restart_the_world_counts_every_request_the_restart_affected(
        runs: dict[str, Run]) -> None:  # fmt: skip
    # it stops every TE of the model: their requests count too, not only the failed TE's (3 of the 7)
    from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report

    r, c = runs["restart-world"], cell(runs, "restart-world")
    cfg = config("restart-world", "npu-crash", REQUESTS, 0)
    (line,) = recovery_report(cfg.faults, recovery_events(r.sink.steps), {"te/2": ("hw/s1/npu0",)}).lines  # type: ignore[arg-type]
    assert (line.failed, line.retried) == (c.failed, c.affected - c.failed) == (7, 0)
    assert line.text().endswith("requests: 7 failed, 0 retried")
