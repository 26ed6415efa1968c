"""`deepserve sim` and `config show` on the inputs issue 29 §6 found answered wrongly: each is one
precise line and exit 2, or the run reports what it did. In-process (`main()`): the process
boundary is not what these check."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from deepserve.actors.workload.messages import RequestDone
from deepserve.actors.workload.metrics import Collector
from deepserve.adapters.tokenizer import HfTokenizer
from deepserve.cli import sim
from deepserve.cli.main import main

MOONCAKE_ROW = '{{"timestamp": {t}, "input_length": {n}, "output_length": 8, "hash_ids": {ids}}}\n'


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str, *needles: str) -> str:
    assert rc == 2, err
    (line,) = err.splitlines()
    assert "Traceback" not in err
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def test_example_log_none_writes_no_log(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = _cli(capsys, "sim", "example", "--log", "none", "--requests", "20", "--json")
    assert rc == 0, err
    assert json.loads(out)["log"] == "none" and json.loads(out)["jobs_done"] == 20
    assert list(tmp_path.iterdir()) == []  # neither a file named `none` nor runs/


def test_example_requests_are_capped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = _cli(capsys, "sim", "example", "--log", "none", "--requests", str(sim.MAX_EXAMPLE_JOBS + 1))
    _one_line_error(rc, err, f"--requests {sim.MAX_EXAMPLE_JOBS + 1}", "at most 1,000,000 jobs")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--requests", "1001"), "--requests 1001: the trace "),
        (("--set", "workload.requests=1500"), "workload.requests = 1500: the trace "),
    ],
)
def test_more_requests_than_the_trace_holds_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    rc, _, err = _cli(capsys, "sim", "mooncake-16te", "--log", "run.db", *args)
    _one_line_error(rc, err, needle, "mooncake_conv_1k.jsonl has 1000 requests")
    assert not (tmp_path / "run.db").exists()  # refused before anything ran


def test_a_directory_is_not_an_unknown_scenario(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    rc, _, err = _cli(capsys, "sim", "scenarios")
    _one_line_error(rc, err, "scenarios is a directory", "a TOML file")


def test_a_prompt_no_te_can_hold_is_refused_naming_the_row(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    big = 4_000_000
    rows = [MOONCAKE_ROW.format(t=i, n=600, ids=[i, i + 10]) for i in range(2)]
    rows.append(MOONCAKE_ROW.format(t=2, n=big, ids=list(range(100, 100 - (-big // 512)))))
    (tmp_path / "big.jsonl").write_text("".join(rows))
    rc, _, err = _cli(capsys, "sim", "mooncake-16te", "--trace", "big.jsonl", "--log", "none")
    # mooncake-16te: Llama-3-8B on a 910B, 618 KV blocks of 512 tokens a DP group
    _one_line_error(rc, err, "big.jsonl:3: input_length: 4000000 tokens exceed the 316415 ", "618 blocks")
    (tmp_path / "big.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2023-11-16 18:15:46.6805900,374,44\n"
                                      "2023-11-16 18:15:47.6805900,9000,44\n")  # fmt: skip
    rc, _, err = _cli(capsys, "sim", "pd-1p1d", "--trace", "big.csv", "--log", "none",
                      "--set", "cluster.scheduler.decode_kv_blocks=50")  # fmt: skip
    _one_line_error(rc, err, "big.csv:3: ContextTokens: 9000 tokens exceed the 6399 ", "50 blocks of 128")


def test_config_show_blames_the_set_that_broke_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _cli(capsys, "config", "show", "--set", "cluster.topology=cm384")
    _one_line_error(rc, err, "error: --set cluster.topology=cm384: cluster.hardware: '910b' does not match")
    rc, _, err = _cli(capsys, "sim", "mooncake-16te", "--set", "cluster.topology=cm384")
    _one_line_error(rc, err, "error: --set cluster.topology=cm384: cluster.hardware:")
    # the key itself still comes first: the --set of the hardware is the one named
    rc, _, err = _cli(capsys, "config", "show", "--set", "cluster.topology=cm384", "--set", "cluster.hardware=910b")
    _one_line_error(rc, err, "error: --set cluster.hardware=910b: cluster.hardware:")


def test_a_missing_tokenizer_file_is_named_before_the_package(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as when the package is not installed
    with pytest.raises(ValueError, match=r"^tokenizer: nope/tokenizer.json: no such file$"):
        HfTokenizer("nope/tokenizer.json")
    rc, _, err = _cli(capsys, "config", "show", "--set", "daemon.tokenizer=nope/tokenizer.json")
    _one_line_error(rc, err, "daemon.tokenizer: nope/tokenizer.json: no such file")


HANG = """name = "hang"
[cluster]
tes = {tes}
[workload]
trace = "builtin:azure_conv_500"
[[faults]]
at_s = {at_s}
kind = "hang-npu"
target = "hw/s0/npu0"
"""


def test_failed_requests_latencies_are_reported(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Two TEs, the first one's NPU hangs at 5 s: its requests fail after waiting ~2 minutes each
    # (one attempt a task, and no heartbeats to find the hung TE: else the JE retries them
    # elsewhere, or the TE is replaced, and all complete)
    (tmp_path / "hang.toml").write_text(HANG.format(tes=2, at_s=5.0))
    once = ("--set", "scheduling.max_attempts=1", "--set", "control.heartbeats=false")
    rc, out, err = _cli(capsys, "sim", "hang.toml", "--requests", "100", "--log", "none", "--json", *once)
    assert rc == 0, err
    s = json.loads(out)
    assert s["failed"] > 0 and s["completed"] > 0
    assert s["failed_e2e_ms_p50"] > 120_000 > s["e2e_ms_p99"]  # the completed ones' keys unchanged
    assert s["failed_e2e_ms_p50"] <= s["failed_e2e_ms_p90"] <= s["failed_e2e_ms_p99"] <= s["failed_e2e_ms_max"]
    rc, out, err = _cli(capsys, "sim", "hang.toml", "--requests", "100", "--log", "none", *once)
    assert rc == 0, err
    assert f"e2e ms, failed  p50 {s['failed_e2e_ms_p50']:.1f}" in out
    assert f"(arrival to failure, {s['failed']} failed)" in out


def test_a_run_where_nothing_completes_prints_no_nan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "hang.toml").write_text(HANG.format(tes=1, at_s=0.0))  # no heartbeats: never replaced
    rc, out, err = _cli(capsys, "sim", "hang.toml", "--requests", "5", "--log", "none", "--set", "control.heartbeats=false")
    assert rc == 0, err
    assert "(0 completed, 5 failed" in out and "nan" not in out
    assert "TTFT ms  none (no completed request)" in out


def test_collector_keeps_failed_latencies_apart() -> None:
    def done(i: int, status: str, wait_s: float) -> RequestDone:
        return RequestDone(request_id=f"r{i}", status=status, reason="x", arrival_s=0.0,
                           first_token_s=0.1 if status == "completed" else None, finish_s=wait_s,
                           prompt_tokens=10, cached_prompt_tokens=0, output_tokens=2, te="te/0")  # fmt: skip

    s = Collector().extend([done(0, "completed", 1.0), done(1, "failed", 100.0), done(2, "failed", 300.0),
                            done(3, "cancelled", 900.0)]).summary()  # fmt: skip
    assert (s.completed, s.failed, s.cancelled) == (1, 2, 1)
    assert s.e2e_ms_p99 == pytest.approx(1000.0)
    assert s.failed_e2e_ms_p50 == pytest.approx(200_000.0) and s.failed_e2e_ms_max == pytest.approx(300_000.0)


def test_bench_sim_refuses_more_requests_than_its_trace_holds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [MOONCAKE_ROW.format(t=i, n=600, ids=[i, i + 10]) for i in range(3)]
    (tmp_path / "mooncake_conversation.jsonl").write_text("".join(rows))
    monkeypatch.setenv("DEEPSERVE_TRACES", str(tmp_path))  # the bench's "full trace": 3 rows
    rc, _, err = _cli(capsys, "bench", "sim", "--requests", "4", "--json")
    _one_line_error(rc, err, "--requests 4: the trace ", "mooncake_conversation.jsonl has 3 requests")
