"""The shipped incident (issue 31 §3, configs/scenarios/incident-prefill-crash.toml): a mixed
Llama-3-8B cluster (colocated TEs beside a P/D pool) on the Azure conversation trace loses a
prefill NPU at 30 s and a decode TE at 60 s; the control plane replaces both, every request
completes, the cluster ends at full strength, the per-fault accounting names each detection and
recovery, `replay why` on a request the kill hit tells the story, and the log replays identically.
The first 250 requests (65 s of the trace) keep it short; both faults land while they run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import in_process

from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report
from deepserve.cluster.config import load
from deepserve.cluster.layout import plan
from deepserve.persistence.factory import open_log

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, object], Path]:
    tmp = tmp_path_factory.mktemp("incident")
    log = tmp / "incident.db"
    res = in_process("sim", SCENARIO, "--requests", "250", "--json", "--set", f"log={log}", cwd=tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), log


def test_every_request_completes_and_the_cluster_ends_at_full_strength(run: tuple[dict[str, object], Path]) -> None:
    out, _ = run
    assert (out["requests"], out["completed"], out["failed"]) == (250, 250, 0)
    assert out["completed"] / out["requests"] >= 0.99  # type: ignore[operator]
    assert (out["faults_injected"], out["recoveries"], out["tes_ready_at_end"], out["tes_target"]) == (2, 2, 6, 6)


def test_each_fault_is_accounted_for(run: tuple[dict[str, object], Path]) -> None:
    _, log = run
    cfg = load(SCENARIO)
    report = recovery_report(cfg.faults, recovery_events(open_log(str(log)).steps()),
                             {s.te: s.npus for s in plan(cfg).slots})  # fmt: skip
    assert [ln.text() for ln in report.lines] == [
        "fault at 30 s: npu-crash hw/s1/npu0 (te/3): detected after 1 s (device-lost), recovered after 7.57 s; "
        "requests: 0 failed, 1 retried",
        "fault at 60 s: kill-te te/5: detected after 3 s (silent), recovered after 9.57 s; "
        "requests: 0 failed, 18 retried",
    ]
    assert (report.faults_injected, report.recoveries, report.tes_ready_at_end, report.tes_target) == (2, 2, 6, 6)


def test_replay_why_tells_an_affected_request_s_story(run: tuple[dict[str, object], Path]) -> None:
    _, log = run
    res = in_process("replay", "why", str(log), "r143", cwd=log.parent)
    assert res.returncode == 0, res.stderr
    story = [ln for ln in res.stdout.splitlines() if not ln.startswith(" ")]
    expected = [
        "request r143: completed (length)",
        "JE je/0: decode task r143/decode.1 -> te/5",
        "FAULT (ext/fault) -> pods: KillPod te=te/5",
        "CONTROL cluster: te/5 generation 1 declared failed (silent): 3 heartbeats missed in a row",
        "je/0: task r143/decode.1 on te/5 failed: te/5 left the decode group",
        "JE je/0: prefill task r143/prefill.2 -> te/4",
        "JE je/0: decode task r143/decode.2 -> te/6",
        "CONTROL cluster: te/5 generation 2 ready (its replacement, booted cold)",
        "je/0: completed on te/6: length",
    ]
    at = [next(i for i, ln in enumerate(story) if want in ln) for want in expected]
    assert at == sorted(at)  # in this order


def test_the_log_replays_identically(run: tuple[dict[str, object], Path]) -> None:
    _, log = run
    res = in_process("replay", "verify", str(log), cwd=log.parent)
    assert res.returncode == 0 and res.stdout.startswith("identical: "), res.stdout + res.stderr
