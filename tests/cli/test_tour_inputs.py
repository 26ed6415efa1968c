"""Bad input a user tour found ending in an internal error (exit 3), silently ignored, or blaming
the wrong key: each is now one line naming the field, exit 2, before any work is done."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.persistence import open_log
from deepserve.replay import verify

URL = ("--admin-url", "http://127.0.0.1:9")  # checked before any request: nothing listens there


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("sim", "pd-1p1d", "--set", "cluster.model=qwen2-72b", "--log", "none"),
         ["--set cluster.model=qwen2-72b", "cluster.model", "leaves no HBM for KV"]),
        (("config", "show", "--set", "cluster.model=deepseek-v3"), ["cluster.model", "leaves no HBM for KV"]),
        (("config", "show", "--set", "daemon.tokenizer=/nonexistent.json"),
         ["--set daemon.tokenizer=/nonexistent.json", "daemon.tokenizer"]),
        (("config", "show", "--set", "scheduling.params.threshold=abc"),
         ["--set scheduling.params.threshold=abc", "scheduling.params", "Expected `int | float`"]),
        (("config", "show", "--set", "pd.prefill_tes=0"), ["--set pd.prefill_tes=0", "pd.prefill_tes:"]),
        (("bench", "sim", "--set", "cluster.mode=pd"), ["--set", "a pd scenario's KV crosses servers"]),
        (("fault", "kill-te", "te/0", "--admin-url", "notaurl"), ["--admin-url", "'notaurl'"]),
        (("status", "--admin-url", "notaurl"), ["--admin-url", "'notaurl'"]),
        (("fault", "link-degrade", "s0/npu0/roce", "--bw-factor", "nan", *URL), ["--bw-factor", "nan"]),
        (("fault", "kill-te", "te/0", "--bw-factor", "0.5", *URL), ["--bw-factor", "only for link-degrade"]),
        (("fault", "kill-te", "te/0", "--region", "kv", *URL), ["--region", "only for hbm-fault"]),
        (("bench", "policies", "--slo-ttft-ms", "-1"), ["--slo-ttft-ms", "positive finite"]),
        (("bench", "policies", "--slo-ttft-ms", "nan"), ["--slo-ttft-ms", "positive finite"]),
        (("bench", "policies", "--slo-tpot-ms", "0"), ["--slo-tpot-ms", "positive finite"]),
        (("bench", "policies", "--rps", "1,,2"), ["--rps", "an empty one"]),
        (("bench", "policies", "--requests", "5", "--policies", "round_robin", "--cluster", "fig7", "--rps", "1"),
         ["--requests 5", "mooncake_conv_1k", "arrive at one time"]),
    ],
)
def test_refused_with_one_line_naming_the_field(tmp_path: Path, args: tuple[str, ...], needles: list[str]) -> None:
    line = assert_one_line_error(in_process(*args, cwd=tmp_path), *needles)  # refused before any work
    assert "internal error" not in line


def test_workers_write_a_run_directory_even_for_a_one_server_cluster(tmp_path: Path) -> None:
    """docs/sim.md: `--workers N` takes a directory; a cluster on one server runs in one process
    (it was refused: `--log dd is a directory`)."""
    (tmp_path / "dd").mkdir()
    res = deepserve("sim", "mooncake-16te", "--requests", "12", "--set", "cluster.tes=3", "--workers", "2",
                    "--log", "dd", "--json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "dd").iterdir()) == ["w0.db"]
    log = open_log(str(tmp_path / "dd" / "w0.db"))
    try:
        assert verify(log).identical
    finally:
        log.close()


def test_a_split_run_missing_a_worker_log_is_refused(tmp_path: Path) -> None:
    """Each worker log's run config names its partition (index of `of`): a directory lacking one
    is not the whole run (it verified `identical` on the other worker's file: a user tour)."""
    (tmp_path / "run").mkdir()
    res = deepserve("sim", "mooncake-16te", "--requests", "24", "--workers", "2", "--log", "run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    (tmp_path / "run" / "w1.db").unlink()
    for cmd in (("replay", "verify", "run"), ("replay", "digest", "run")):
        assert_one_line_error(in_process(*cmd, cwd=tmp_path), "the run wrote w1.db, which the directory lacks")


def test_a_run_directory_with_a_log_holding_no_run_is_refused_naming_it(tmp_path: Path) -> None:
    """A file with no run (a copy taken before its process began its run) made verify say
    `the log holds no run` without naming it, and digest ignore it (a user tour)."""
    import shutil
    import sqlite3

    (tmp_path / "run").mkdir()
    res = deepserve("sim", "mooncake-16te", "--requests", "24", "--workers", "2", "--log", "run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    shutil.copy(tmp_path / "run" / "w0.db", tmp_path / "run" / "w9.db")
    with sqlite3.connect(tmp_path / "run" / "w9.db") as db:
        db.execute("DELETE FROM runs")
    for cmd in (("replay", "verify", "run"), ("replay", "digest", "run")):
        assert_one_line_error(in_process(*cmd, cwd=tmp_path), "w9.db: holds no run")
