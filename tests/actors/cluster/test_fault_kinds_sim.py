"""Every platform fault kind a scenario's `[[faults]]` can schedule (adapters/scenario/faults.py),
run on a 3-TE cluster with its control plane under SimDriver: each is an external input, its
effect and the recovery are recorded, and the log replays identically."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from recovery_harness import build_run, events

from deepserve.actors.cluster.heartbeat import HbLossStarted
from deepserve.actors.cluster.state import OwnerCancelled, TeDeclaredFailed
from deepserve.actors.flowserve.master.state import TaskEnded
from deepserve.actors.gateway.messages import GatewayJeDown
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.faults import FaultSpec, check_faults
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

STREAMED_ON_TE1 = ["r1", "r10", "r4", "r7"]  # te/1's 4 running tasks (max_running) when it dies at 2 s


def outcome(run: Any) -> tuple[Counter[str], list[tuple[float, str, int, str]], dict[str, tuple[int, str]]]:
    d, out = run
    done = [m for m in out if isinstance(m, RequestDone)]
    assert len({m.request_id for m in done}) == len(done)  # one terminal answer each
    declared = [(t, e.te, e.generation, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]
    tes = {te: (r.generation, r.state) for te, r in d.actor("cluster").state.tes.items()}
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
    return Counter(m.status for m in done), declared, tes


def failed_ids(run: Any) -> list[str]:
    return sorted(m.request_id for m in run[1] if isinstance(m, RequestDone) and m.status != "completed")


def test_kill_te_is_found_by_its_silence_and_replaced() -> None:
    run = build_run([{"at_s": 2.0, "kind": "kill-te", "target": "te/1"}])
    statuses, declared, tes = outcome(run)
    # 3 ticks of 0.5 s with no answer after the pod died at 2.0: declared at 3.5, "silent"
    assert declared == [(3.5, "te/1", 1, "silent")]
    assert statuses == Counter(completed=32, failed=4) and failed_ids(run) == STREAMED_ON_TE1
    assert tes == {"te/0": (1, "ready"), "te/1": (2, "ready"), "te/2": (1, "ready")}


def test_kill_te_process_is_seen_by_the_launcher_and_failed_at_once() -> None:
    run = build_run([{"at_s": 2.0, "kind": "kill-te-process", "target": "te/1"}])
    statuses, declared, tes = outcome(run)
    assert declared == [(2.0, "te/1", 1, "exited")]
    assert statuses == Counter(completed=32, failed=4) and failed_ids(run) == STREAMED_ON_TE1
    assert tes["te/1"] == (2, "ready")


def test_a_short_heartbeat_loss_is_tolerated_a_long_one_replaces_the_te() -> None:
    short = build_run([{"at_s": 2.0, "kind": "heartbeat-loss", "target": "te/1", "duration_s": 0.7}])
    statuses, declared, tes = outcome(short)
    assert events(short[0], "cluster/heartbeat", HbLossStarted)[0][1].until_s == pytest.approx(2.7)
    assert declared == [] and statuses == Counter(completed=36) and tes["te/1"] == (1, "ready")
    long = build_run([{"at_s": 2.0, "kind": "heartbeat-loss", "target": "te/1", "duration_s": 5.0}])
    statuses, declared, tes = outcome(long)
    assert declared == [(3.5, "te/1", 1, "silent")]  # the rules: 3 rounds unanswered, whatever the cause
    assert statuses == Counter(completed=32, failed=4) and tes["te/1"] == (2, "ready")


def test_kill_je_retries_its_unstreamed_jobs_on_another_je_and_fails_streaming_ones() -> None:
    quiet = build_run([{"at_s": 2.0, "kind": "kill-je", "target": "je/0"}], jes=2, stream=False)
    statuses, declared, _ = outcome(quiet)
    down = events(quiet[0], "gw", GatewayJeDown)
    assert len(down) == 1 and down[0][0] == 2.0
    assert len(down[0][1].retried) == 10 and {je for _, je in down[0][1].retried} == {"je/1"}
    assert down[0][1].failed == () and statuses == Counter(completed=36) and declared == []
    streaming = build_run([{"at_s": 2.0, "kind": "kill-je", "target": "je/0"}], jes=2, stream=True)
    statuses, _, _ = outcome(streaming)
    assert statuses == Counter(completed=26, failed=10)
    reasons = {m.reason for m in streaming[1] if isinstance(m, RequestDone) and m.status == "failed"}
    assert reasons == {"its JE je/0 was lost (scenario fault at 2 s: kill-je je/0); "
                       "a streaming response cannot be resumed"}  # fmt: skip


def test_a_lost_je_s_tasks_are_cancelled_on_the_tes_not_run_to_their_end_for_nobody() -> None:
    # P/D-Serve §3.4's zombies: before, the 10 tasks of je/0 ran on to their 400th token for a JE
    # that was gone (and for requests the gateway had failed or sent again elsewhere).
    for stream in (True, False):
        d, _ = build_run([{"at_s": 2.0, "kind": "kill-je", "target": "je/0"}], jes=2, stream=stream)
        (down,) = events(d, "gw", GatewayJeDown)
        lost = {rid for rid, _ in down[1].retried} | set(down[1].failed)
        (told,) = events(d, "cluster", OwnerCancelled)
        assert told[0] == 2.0 and (told[1].owner, told[1].tes) == ("je/0", ("te/0", "te/1", "te/2"))
        ended = [(t, e) for te in ("te/0", "te/1", "te/2") for t, e in events(d, f"{te}/dp/0", TaskEnded)]
        first = {}  # request -> how its first task (je/0's) ended
        for t, e in sorted(ended, key=lambda x: x[0]):
            first.setdefault(e.task_id.split("/")[0], (t, e.status))
        zombies = {rid: first[rid] for rid in lost if rid in first}
        assert len(zombies) == 10 and {status for _, status in zombies.values()} == {"cancelled"}
        # at once when waiting, at the end of its forward pass when in one (the next pass boundary)
        assert 2.0 == min(t for t, _ in zombies.values()) and max(t for t, _ in zombies.values()) < 2.02
        assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


@pytest.mark.parametrize(("fault", "key", "says"), [
    ({"kind": "kill-te", "target": "te/9"}, "faults.0.target", "no TE 'te/9' in this cluster (te/0, te/1, te/2)"),
    ({"kind": "kill-je", "target": "te/1"}, "faults.0.target", "no JE 'te/1' in this cluster (je/0)"),
    ({"kind": "heartbeat-loss", "target": "te/1"}, "faults.0.duration_s", "required for heartbeat-loss"),
    ({"kind": "kill-te", "target": "te/1", "duration_s": 2.0}, "faults.0.duration_s",
     "only for heartbeat-loss, not kill-te"),
    ({"kind": "kill-te-process", "target": "hw/s0/npu1"}, "faults.0.target", "no TE 'hw/s0/npu1' in this cluster"),
])  # fmt: skip
def test_a_fault_that_cannot_apply_names_its_key(fault: dict[str, Any], key: str, says: str) -> None:
    spec = FaultSpec(at_s=1.0, **fault)
    problems = check_faults((spec,), "gen1", 1, ["te/0", "te/1", "te/2"], ["je/0"])
    assert [k for k, _ in problems] == [key] and says in problems[0][1]


def test_without_the_cluster_s_names_a_target_must_look_like_one() -> None:
    spec = FaultSpec(at_s=1.0, kind="kill-je", target="gateway")
    assert check_faults((spec,), "gen1", 1) == [("faults.0.target", "kill-je targets a JE (je/N), got 'gateway'")]
