"""The JE acts on link probing's verdicts (issue 33 §1; xDeepServe §6.1, P/D-Serve §3.4), and the
`reroute` rung routes around a dead NIC (§2). benchmarks/recovery.py's cluster: 2 prefill TEs on
server 0, 2 decode TEs on server 1; the first 120 Azure conversation requests; at 20 s decode
te/2's RoCE NIC (`s1/npu0/roce`) goes down, or (kv-saturation) runs at 0.01 % of its bandwidth.

`link-probe` is the old way (probing records a verdict, the JE keeps its blind cool-down: the
prefill is set aside 5 s, then the next request takes the same dead path); `link-route` has the
verdict reach the JEs (prober -> host monitor -> cluster manager -> every JE), which stop pairing
over the dead NIC until a re-probe sees it carry data again."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.cluster.autoscaler_messages import TeRoleFlipped
from deepserve.actors.cluster.kvpaths import KvPathVerdict
from deepserve.actors.cluster.ladder import LadderChose
from deepserve.actors.cluster.state import TeDeclaredFailed, TeReady
from deepserve.actors.flowserve.distflow.probe import LinkDiagnosed
from deepserve.actors.je.kvlinks import KvRouteChanged
from deepserve.actors.je.messages import PrefillSetAside, RouteDecided
from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.benchmarks.recovery import FAULT_AT_S, Run, _cell, simulate
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

N = 120
UP_AT_S = 40.0
LINK_UP = (FaultSpec(at_s=UP_AT_S, kind="link-up", target="s1/npu0/roce"),)


def events(run: Run, cls: type) -> list[tuple[float, str, Any]]:
    return [(s.input.t, s.input.actor, decode(e.type, e.payload)) for s in run.sink.steps for e in s.events
            if e.type == cls.__name__]  # fmt: skip


def to_te2(run: Run, lo: float, hi: float, phase: str = "") -> list[RouteDecided]:
    return [e for t, _, e in events(run, RouteDecided) if lo <= t < hi and e.decision.chosen == "te/2"
            and (not phase or e.phase == phase)]  # fmt: skip


@pytest.fixture(scope="module")
def streamed() -> dict[str, Run]:
    return {rung: simulate(rung, "link-down", N, stream=True) for rung in ("link-probe", "link-route")}


def test_a_dead_nic_mid_run_fails_1_stream_where_the_cool_down_failed_87(streamed: dict[str, Run]) -> None:
    # streamed clients: the prefill sent the first token, so a decode whose KV never arrives fails the request
    old, new = (_cell(r, "link-down", streamed[r].requests, streamed[r].done, streamed[r].sink, 0.0)
                for r in ("link-probe", "link-route"))  # fmt: skip
    assert (old.failed, old.completed) == (87, 33)
    assert (new.failed, new.completed) == (1, 119)
    assert old.detected_s is not None and new.detected_s is not None  # both probed: a link fault
    # the old way: the prefills set aside again and again, the decode with the dead NIC still picked
    assert len(events(streamed["link-probe"], PrefillSetAside)) == 87
    assert len(to_te2(streamed["link-probe"], FAULT_AT_S + 1, 1e9, "decode")) > 50
    # the new way: one verdict, one routing change, no cool-down, and no decode to te/2 after it
    run = streamed["link-route"]
    (verdict,) = [e for _, a, e in events(run, KvPathVerdict)]
    assert (verdict.verdict, verdict.src_te, verdict.dst_te, verdict.nic_te) == ("link-fault", "te/0", "te/2", "te/2")
    changes = events(run, KvRouteChanged)
    assert [(a, e.key, e.down) for _, a, e in changes] == [("je/0", "nic:te/2", True)]
    assert events(run, PrefillSetAside) == []
    assert to_te2(run, changes[0][0] + 1e-9, 1e9, "decode") == []
    assert verify(MemoryLog(run.sink)).identical  # type: ignore[arg-type]


def test_under_saturation_no_link_is_marked_down_and_the_decode_is_backed_off() -> None:
    old = simulate("link-probe", "kv-saturation", N)  # the cool-down treats it as a fault: prefills set aside
    assert {e.te for _, _, e in events(old, PrefillSetAside)} == {"te/0", "te/1"}
    for rung in ("link-route", "reroute"):
        run = simulate(rung, "kv-saturation", N)
        verdicts = {e.verdict for _, _, e in events(run, LinkDiagnosed)}
        assert verdicts == {"saturation"}, rung
        keys = {e.key for _, _, e in events(run, KvRouteChanged)}
        assert keys == {"busy:te/2"}, rung  # a back-off by load: no pair, no NIC down
        assert all(e.until_s > 0 for _, _, e in events(run, KvRouteChanged) if e.down)
        assert events(run, LadderChose) == [] and events(run, TeRoleFlipped) == []  # the ladder leaves it alone
        assert events(run, TeDeclaredFailed) == []
        c = _cell(rung, "kv-saturation", run.requests, run.done, run.sink, 0.0)
        assert (c.failed, c.completed) == (0, N)
    assert verify(MemoryLog(run.sink)).identical  # type: ignore[arg-type]


def test_the_path_is_used_again_once_a_re_probe_sees_the_nic_carry_data() -> None:
    run = simulate("link-route", "link-down", N, more=LINK_UP)
    changes = [(t, e.key, e.down) for t, _, e in events(run, KvRouteChanged)]
    assert [(k, d) for _, k, d in changes] == [("nic:te/2", True), ("nic:te/2", False)]
    down_at, up_at = changes[0][0], changes[1][0]
    assert UP_AT_S <= up_at <= UP_AT_S + 2.0  # the monitor re-probes every kv_link_probe_s = 2 s
    assert to_te2(run, down_at + 1e-6, up_at, "decode") == []
    assert len(to_te2(run, up_at, 1e9, "decode")) >= 10  # te/2 decodes again


def test_reroute_serves_whole_requests_on_the_te_with_the_dead_nic_and_moves_it_back() -> None:
    # twice the trace's rate: enough traffic that the policy needs te/2 while its NIC is dead
    run = simulate("reroute", "link-down", 300, extra=("workload.rps_scale=2",), more=LINK_UP)
    chose = [(t, e.te, e.rung, e.diagnosis) for t, _, e in events(run, LadderChose)]
    assert [c[1:] for c in chose] == [("te/2", "reroute", "link-fault"), ("te/2", "reroute", "link-healthy")]
    flips = [(e.te, e.src, e.dst) for _, _, e in events(run, TeRoleFlipped)]
    assert flips == [("te/2", "llama3-8b/decode", "llama3-8b/colocated"),
                     ("te/2", "llama3-8b/colocated", "llama3-8b/decode")]  # fmt: skip
    assert events(run, TeDeclaredFailed) == []  # not replaced: its NPUs are fine
    between = to_te2(run, chose[0][0] + 1e-6, chose[1][0])
    assert [e.phase for e in between] == ["chat", "chat"]  # whole requests: no KV link
    assert {e.phase for e in to_te2(run, chose[1][0] + 1e-6, 1e9)} == {"decode"}
    c = _cell("reroute", "link-down", run.requests, run.done, run.sink, 0.0)
    assert (c.failed, c.completed) == (0, 300)
    assert verify(MemoryLog(run.sink)).identical  # type: ignore[arg-type]


def test_the_recovery_report_line_of_a_link_fault_says_when_probing_detected_it() -> None:
    from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report
    from deepserve.benchmarks.recovery import config

    lines = {}
    for rung in ("replace", "link-route"):
        run = simulate(rung, "link-down", N)
        (lines[rung],) = recovery_report(config(rung, "link-down", N, 0).faults, recovery_events(run.sink.steps),
                                         {}).lines  # fmt: skip
    assert lines["replace"].text() == "fault at 20 s: link-down s1/npu0/roce: not detected; requests: 0 failed, 89 retried"
    assert lines["link-route"].text() == ("fault at 20 s: link-down s1/npu0/roce: detected after 0.165 s (link-fault); "
                                          "requests: 0 failed, 1 retried")  # fmt: skip


def test_a_replacement_is_a_new_instance_whose_paths_are_forgotten_until_probed_again() -> None:
    # te/2's process is killed at 25 s while its NIC is still dead: its replacement registers, the
    # JE forgets te/2's NIC, and the first transfer to it finds the NIC dead again
    kill = (FaultSpec(at_s=25.0, kind="kill-te-process", target="te/2"),)
    run = simulate("link-route", "link-down", N, more=kill)
    changes = [(t, e.key, e.down, e.reason) for t, _, e in events(run, KvRouteChanged)]
    assert [c[1:3] for c in changes] == [("nic:te/2", True), ("nic:te/2", False), ("nic:te/2", True)]
    assert changes[1][3] == "te/2 is a new instance"
    (ready,) = [t for t, _, e in events(run, TeReady) if e.te == "te/2" and e.generation == 2]
    assert changes[1][0] == ready < changes[2][0]
    c = _cell("link-route", "link-down", run.requests, run.done, run.sink, 0.0)
    assert (c.failed, c.completed) == (0, N)
