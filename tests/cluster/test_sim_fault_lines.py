"""`deepserve sim` accounts for each scheduled fault (issue 31 §2): a line per `[[faults]]` entry
(detected after, recovered after, requests affected) in the text summary and a `faults` list in
`--json`, the same with a log or with `--log none` (the run keeps the few events it needs as it
goes), equal to the recovery report read off the log; `faults_injected` counts scheduled faults,
a `kill-je` (two inputs: the JE's stop and the gateway's notice) once."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from cliproc import in_process

from deepserve.actors.cluster.recovery_report import recovery_events, recovery_report
from deepserve.cluster.config import load
from deepserve.cluster.layout import plan
from deepserve.cluster.sim import run
from deepserve.persistence.memory import MemorySink

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")
FAULTS = ("faults=[{at_s = 10.0, kind = 'npu-crash', target = 'hw/s1/npu0'}, "
          "{at_s = 15.0, kind = 'kill-te', target = 'te/5'}, {at_s = 18.0, kind = 'kill-je', target = 'je/0'}]")  # fmt: skip
OVERRIDES = ("workload.requests=100", FAULTS, "scheduling.jes=2")


def test_each_fault_gets_its_line_with_a_log_or_without() -> None:
    cfg = load(SCENARIO, OVERRIDES)
    sink = MemorySink()
    logged = run(cfg, sink=sink).summary
    unlogged = run(cfg).summary
    from_log = recovery_report(cfg.faults, recovery_events(sink.steps), {s.te: s.npus for s in plan(cfg).slots})
    assert logged["faults"] == unlogged["faults"] == [msgspec.to_builtins(ln) for ln in from_log.lines]
    kinds = [(f["kind"], f["te"], f["diagnosis"], f["recovered_after_s"] is not None) for f in logged["faults"]]
    assert kinds == [("npu-crash", "te/3", "device-lost", True), ("kill-te", "te/5", "silent", True),
                     ("kill-je", "", "gateway", False)]  # fmt: skip
    assert logged["faults_injected"] == unlogged["faults_injected"] == from_log.faults_injected == 3
    assert logged["recoveries"] == from_log.recoveries == 2


def test_sim_prints_a_line_per_fault_and_json_lists_them(tmp_path: Path) -> None:
    sets = [a for o in OVERRIDES for a in ("--set", o)]
    text = in_process("sim", SCENARIO, *sets, "--log", "none", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = [ln.strip() for ln in text.stdout.splitlines() if ln.strip().startswith("fault ")]
    assert len(lines) == 3, text.stdout
    assert lines[0].startswith("fault  at 10 s: npu-crash hw/s1/npu0 (te/3): detected after 2 s (device-lost), "
                               "recovered after 8.57 s; requests: "), lines  # fmt: skip
    assert lines[2].startswith("fault  at 18 s: kill-je je/0: detected after 0 s (gateway)"), lines
    res = in_process("sim", SCENARIO, *sets, "--log", "none", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [f["kind"] for f in out["faults"]] == ["npu-crash", "kill-te", "kill-je"]
    assert out["faults_injected"] == 3


def test_a_run_without_faults_has_no_fault_lines(tmp_path: Path) -> None:
    cfg = load(SCENARIO, ("workload.requests=10", "faults=[]"))
    out = run(cfg).summary
    assert "faults" not in out and out["faults_injected"] == 0
