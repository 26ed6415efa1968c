"""`deepserve hw predict`: the table, --json, and bad input as one line on stderr with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from deepserve.adapters.hardware.predict import predict
from deepserve.cli import main


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(["hw", "predict", *argv])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_predict_prints_latency_grid_kv_capacity_and_load_paths(capsys):
    code, out, err = _run(capsys, "--model", "llama3-70b", "--npu", "910b", "--tp", "8")
    assert (code, err) == (0, "")
    for needle in (
        "prefill_ms",
        "decode_ms",
        "KV capacity",
        "ssd",
        "dram-hit",
        "npu-fork-hccs",
        "npu-fork-roce",
    ):
        assert needle in out, needle
    p = predict("llama3-70b", "910b", 8)
    assert f"{p.kv_capacity_tokens:,d} tokens" in out
    assert len(
        [line for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    ) == len(p.latency)


def test_predict_json_is_the_prediction(capsys):
    code, out, _ = _run(
        capsys,
        "--model",
        "llama3-8b",
        "--npu",
        "910c",
        "--tp",
        "1",
        "--json",
        "--batch-sizes",
        "1,4",
        "--contexts",
        "512",
    )
    assert code == 0
    doc = json.loads(out)
    expected = predict("llama3-8b", "910c", 1, batch_sizes=(1, 4), context_tokens=(512,))
    assert doc["kv_capacity_tokens"] == expected.kv_capacity_tokens
    assert [r["batch_size"] for r in doc["latency"]] == [1, 4]
    assert {r["path"] for r in doc["loads"]} == {"ssd", "dram-hit", "npu-fork-ub"}  # no RoCE


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("--model", "gpt-9", "--npu", "910b", "--tp", "8"), "unknown model 'gpt-9'"),
        (("--model", "llama3-70b", "--npu", "910b", "--tp", "3"), "tp: 3 does not divide"),
        (("--model", "llama3-70b", "--npu", "910b", "--tp", "1"), "use a larger tp"),
        (("--model", "llama3-70b", "--npu", "910x", "--tp", "8"), "invalid choice: '910x'"),
        (
            ("--model", "llama3-70b", "--npu", "910b", "--tp", "8", "--contexts", "1,x"),
            "comma-separated",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err


def test_the_installed_command_exits_2_with_one_line():
    res = subprocess.run(
        [sys.executable, "-m", "deepserve", "hw", "predict", "--model", "nope", "--npu", "910b",
         "--tp", "8"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("deepserve: error: model: unknown model 'nope'")
    assert len(res.stderr.splitlines()) == 1
