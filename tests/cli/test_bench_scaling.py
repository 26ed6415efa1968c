"""`deepserve bench scaling`: the issue-34 rows beside their baselines, per-step means, logs that
`replay verify` re-executes and `replay state` shows each new TE's steps in; bad input exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepserve.actors.cluster.prewarm import breakdown
from deepserve.cli.main import main


def test_rows_with_baselines_and_a_log_the_breakdown_replays_from(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    assert main(["bench", "scaling", "--json", "--log", str(tmp_path)]) == 0
    rows = {r["name"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    fork, cold = rows["scale64_prewarm_fork_s"], rows["scale64_cold_s"]
    assert fork["baseline"] == "scale64_cold_s" and fork["baseline_value"] == cold["value"]
    assert fork["value"] < 3.0 and 3 * fork["value"] < cold["value"] and fork["tes_ready"] == cold["tes_ready"] == 64
    assert set(fork["step_means_s"]) == {"scaler_pre", "te_pre_load", "te_load", "te_post_load", "scaler_post", "total"}
    log = str(tmp_path / "scale64-prewarm_fork.db")
    assert main(["replay", "verify", log]) == 0
    capsys.readouterr()
    assert main(["replay", "state", log, "--actor", "cluster", "--json"]) == 0
    tes = json.loads(capsys.readouterr().out)["state"]["tes"]
    again = breakdown(tes, since_s=1.0)  # the state as replay folds it gives the bench's breakdown
    assert again["tes"] == 64 and again["step_means_s"]["total"] == pytest.approx(fork["step_means_s"]["total"], abs=1e-3)
    assert main(["replay", "state", log, "--cluster"]) == 0  # each TE's boot, then the means (Fig. 9)
    out = capsys.readouterr().out
    assert "boot: pod_start 0.100 s, scaler_pre 0.100 s (pre-warmed pod)" in out
    assert "boot steps, mean over 64 TEs booted (s): scaler_pre 0.100" in out
    assert "TE-Load: npu-fork-hccs 7, npu-fork-roce 57" in out


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--rows", "nope"], ["--log", str(tmp_path / "missing")]):
        try:
            code = main(["bench", "scaling", *argv])
        except SystemExit as exc:  # argparse's refusal
            code = exc.code  # type: ignore[assignment]
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("deepserve"), err
