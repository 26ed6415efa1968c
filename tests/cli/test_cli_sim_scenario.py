"""`deepserve sim SCENARIO` for FlowServe scenarios, end to end: --json, --set, --trace, the log
replays identically, and bad input (scenario, override, trace row) is one line, exit 2."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

KEYS = {"requests", "completed", "prefix_hit_rate", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
        "tpot_ms_p99", "wall_s"}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


def test_sim_builtin_scenario_json_and_the_log_verifies(runs: Path) -> None:
    res = in_process("sim", "mooncake-16te", "--requests", "40", "--set", "cluster.tes=2",
                     "--log", "m.db", "--json", cwd=runs)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # no progress bar off a terminal
    (line,) = res.stdout.splitlines()
    out = json.loads(line)
    assert KEYS <= out.keys()
    assert out["requests"] == out["completed"] == 40 and out["scenario"] == "mooncake-16te"
    assert out["ttft_ms_p50"] > 0 and out["tpot_ms_p50"] > 0 and out["wall_s"] > 0
    res = in_process("replay", "verify", "m.db", cwd=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("identical")


def test_sim_toml_file_and_trace_override_text_summary(runs: Path, tmp_path: Path) -> None:
    toml = tmp_path / "mine.toml"
    toml.write_text('name = "mine"\n[cluster]\ntes = 1\n[workload]\ntrace = "builtin:mooncake_conv_1k"\n')
    trace = tmp_path / "azure-like.txt"  # told apart by content, not by name
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")  # fmt: skip
    res = in_process("sim", str(toml), "--trace", str(trace), "--log", "none", cwd=runs)
    assert res.returncode == 0, res.stderr
    for word in ("requests  2 (2 completed", "TTFT ms", "TPOT ms", "e2e ms", "prefix hit rate",
                 "throughput", "simulated requests per wall s"):  # fmt: skip
        assert word in res.stdout, (word, res.stdout)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("sim", "mooncake-16te", "--set", "cluster.tes=0"), ["--set cluster.tes=0: cluster.tes:", ">= 1"]),
        (("sim", "mooncake-16te", "--set", "cluster.colour=red"), ["cluster.colour: unknown key"]),
        (("sim", "pd-1p1d", "--set", "cluster.link=ub"), ["cluster.link", "not a link of topology 'gen1'"]),
        (("sim", "nope"), ["unknown scenario 'nope'", "mooncake-16te"]),
        (("sim", "mooncake-16te", "--trace", "missing.jsonl"), ["missing.jsonl: path: No such file"]),
        (("sim", "example", "--set", "a=1"), ["--trace and --set apply to FlowServe scenarios"]),
        (("sim", "pd-1p1d", "--workers", "2"), ["--workers: a pd scenario's KV crosses servers"]),
        (("sim", "mooncake-16te", "--workers", "2", "--log", "x.db"), ["--log x.db", "give a directory"]),
        (("sim", "mooncake-16te", "--workers", "0"), ["--workers", "positive integer"]),
    ],
)  # fmt: skip
def test_sim_bad_input_is_one_line(runs: Path, args: tuple[str, ...], needles: list[str]) -> None:
    assert_one_line_error(in_process(*args, cwd=runs), *needles)  # refused before any work


def test_sim_bad_trace_row_mid_run_names_file_line_field(runs: Path, tmp_path: Path) -> None:
    good = '{"timestamp": %d, "input_length": 600, "output_length": 4, "hash_ids": [0, %d]}'
    lines = [good % (i * 100, i + 1) for i in range(5)]
    lines.append('{"timestamp": 600, "input_length": 600, "output_length": -4, "hash_ids": [0, 9]}')
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    for workers in ("1", "2"):  # a worker's bad row is the same one line
        res = deepserve("sim", "mooncake-16te", "--trace", str(trace), "--log", "none", "--workers", workers,
                        cwd=runs)  # fmt: skip
        assert_one_line_error(res, f"{trace}:6: output_length:", "outside 1..")


def test_sim_split_over_two_workers_reports_the_same_numbers_and_each_log_verifies(runs: Path) -> None:
    args = ("sim", "mooncake-16te", "--requests", "120", "--set", "workload.rps_scale=8", "--json")
    # the one-process run behind the dispatcher a split run uses (no gateway nor JE in a split)
    one = json.loads(in_process(*args, "--log", "none", "--set", "scheduling.entry=dispatcher", cwd=runs).stdout)
    (runs / "split").mkdir()
    (runs / "split" / "w5.db").write_text("")  # a stale worker file that is not a log: refused
    res = deepserve(*args, "--workers", "2", "--log", "split", cwd=runs)
    assert_one_line_error(res, "split/w5.db exists and is not a deepserve log")
    (runs / "split" / "w5.db").unlink()
    res = deepserve(*args, "--workers", "2", "--log", "split", cwd=runs)
    assert res.returncode == 0, res.stderr
    two = json.loads(res.stdout)
    assert two["workers"] == 2 and one["workers"] == 1 and two["log"] == "split"
    skip = {"wall_s", "sim_requests_per_wall_s", "workers", "log", "deliveries"}
    assert {k: v for k, v in two.items() if k not in skip} == {k: v for k, v in one.items() if k not in skip}
    assert sorted(p.name for p in (runs / "split").glob("*.db")) == ["w0.db", "w1.db"]
    res = in_process("replay", "verify", "split", cwd=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("identical") and "2 logs, each verified on its own" in res.stdout
    # Each worker has its own workload actor: merged, their steps would make a state neither had.
    for cmd in ("state", "log"):
        assert_one_line_error(in_process("replay", cmd, "split", "--actor", "workload", cwd=runs),
                              "workload is a different actor in each of 2 logs", "w0.db", "w1.db")  # fmt: skip
    res = in_process("replay", "state", "split/w1.db", "--actor", "workload", "--json", cwd=runs)
    # 120 requests round-robin over 16 TEs: te/0-7 (w0) get 8 each, te/8-15 (w1) 7 each
    assert res.returncode == 0 and json.loads(res.stdout)["state"]["rr"] == {"chat": 56}, res.stdout[:300]
    assert in_process("replay", "state", "split", "--actor", "hw/s1/npu0", cwd=runs).returncode == 0


def _session(sid: int) -> list[str]:
    """Processes still in session `sid` (the CLI, its workers, their log writers)."""
    out = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split(None, 1)[0] == str(sid)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_split_run_stopped_or_killed_leaves_no_worker_behind(runs: Path, sig: signal.Signals) -> None:
    # Stepwise (no aggregated runs: a message per token), the built-in slice runs for minutes:
    # long enough to be stopped midway.
    (runs / "split-stopped").mkdir(exist_ok=True)
    p = subprocess.Popen([sys.executable, "-m", "deepserve", "sim", "mooncake-16te", "--workers", "2",
                          "--set", "cluster.scheduler.aggregate=false", "--log", "split-stopped"],
                         cwd=runs, start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while len(_session(p.pid)) < 5 and time.monotonic() < deadline:  # CLI, 2 workers, 2 writers
        time.sleep(0.05)
    assert len(_session(p.pid)) == 5, _session(p.pid)
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == (143 if sig == signal.SIGTERM else -9), err
    assert "Traceback" not in err
    deadline = time.monotonic() + 30
    while _session(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _session(p.pid) == []
