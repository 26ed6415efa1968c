"""`replay verify` catches actors that break determinism, naming actor and seq.

The log is written by a sim run in one process and verified by the CLI in
another, with a different PYTHONHASHSEED, so hash order and wall clock really
differ between the original run and the replay.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _run(args: list[str], hashseed: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONHASHSEED": hashseed}
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def _write(tmp_path: Path, culprit: str) -> Path:
    log = tmp_path / f"{culprit}.db"
    code = f"import divactors; divactors.write_log({str(log)!r}, {culprit!r})"
    made = _run([sys.executable, "-c", code], "101", tmp_path)
    assert made.returncode == 0, made.stderr
    return log


def _set_orders_differ() -> bool:
    code = "from divactors import SetIterator as S; print(list(set(S.NAMES)))"
    outs = {_run([sys.executable, "-c", code], h, HERE).stdout for h in ("101", "202")}
    return len(outs) == 2


@pytest.mark.parametrize(
    ("culprit", "seq", "what"),
    [("clock", 4, "event 0"), ("set", 3, "output 0")],
)
def test_verify_names_the_culprit_and_its_first_divergent_seq(tmp_path, culprit, seq, what):
    if culprit == "set":
        assert _set_orders_differ(), "pick hash seeds whose set orders differ"
    log = _write(tmp_path, culprit)
    res = _run([sys.executable, "-m", "deepserve", "replay", "verify", str(log)], "202", tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    assert res.stdout.splitlines()[0].startswith(f"diverged: suspect#{seq} ")
    assert "actor:    suspect" in res.stdout and f"seq:      {seq}" in res.stdout
    assert "input:    DivTick" in res.stdout

    res = _run(
        [sys.executable, "-m", "deepserve", "replay", "verify", str(log), "--json"], "202", tmp_path
    )
    assert res.returncode == 1
    report = json.loads(res.stdout)
    d = report["divergence"]
    assert (report["identical"], d["actor"], d["seq"], d["what"]) == (False, "suspect", seq, what)
    assert d["input"]["type"] == "DivTick" and d["input"]["payload"] == {"n": seq - 1}
    assert d["expected"] != d["actual"]


def test_well_behaved_actors_before_the_culprit_verify(tmp_path):
    """The same log, same hash seed: the set iterator happens to agree with itself."""
    log = _write(tmp_path, "set")
    res = _run([sys.executable, "-m", "deepserve", "replay", "verify", str(log)], "101", tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    # 12 ticks and starts, 36 items
    assert res.stdout.strip() == "identical: 2 actors, 48 inputs (run 'sim-3')"


def test_a_divergence_in_a_log_written_by_other_code_says_so(tmp_path):
    """A run record's code_version said "0.1.0" whatever the tree held, so a log verified after a
    change diverged with no hint why (two user tours). It names the sources' hash now, and verify
    points at a difference."""
    import sqlite3

    from deepserve.core.codeid import CODE_VERSION, source_hash
    from deepserve.persistence.rows import row_crc
    from deepserve.persistence.schema import RUN_FIELDS

    assert CODE_VERSION.endswith("+src." + source_hash()) and len(source_hash()) == 12
    log = _write(tmp_path, "clock")
    with sqlite3.connect(log) as c:
        assert c.execute("SELECT code_version FROM runs").fetchone()[0] == CODE_VERSION
        c.execute("UPDATE runs SET code_version = '0.1.0+src.000000000000'")
        # as other code wrote it: the row's checksum matches its new value
        row = c.execute(f"SELECT {', '.join(RUN_FIELDS)} FROM runs").fetchone()
        c.execute("UPDATE runs SET crc32 = ?", (row_crc(row),))
    res = _run([sys.executable, "-m", "deepserve", "replay", "verify", str(log)], "202", tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    first = res.stdout.splitlines()[0]
    assert first.startswith("diverged: suspect#4 ") and "written by code 0.1.0+src.000000000000" in first
    assert f"this is {CODE_VERSION}" in first
