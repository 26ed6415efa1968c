"""Closing records in a run directory (`deepserve up --processes`: one log per process). A TE
process the daemon killed leaves a log without a closing record, and `daemon.db` records its exit
(`ProcessExited`): that is the run's own story, verified as it was (exit 0). A log without one
whose end nobody recorded is a process that died unseen: said on stderr, `verify` exits 3."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from deepserve.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "daemon"))
from test_processes_verify import write_good  # noqa: E402  (daemon.db records te/0#g1's exit)


def _unclose(path: Path) -> None:
    with sqlite3.connect(path) as db:  # what a killed process leaves: no closing record
        db.execute("DELETE FROM run_ends")


def test_a_killed_process_the_daemon_recorded_is_not_a_cut_log(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    write_good(tmp_path / "daemon.db", 1)
    write_good(tmp_path / "te-0-g1.db", 2)
    _unclose(tmp_path / "te-0-g1.db")
    assert main(["replay", "verify", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert out.err == "" and out.out.count(": identical:") == 2, out
    assert main(["replay", "log", str(tmp_path)]) == 0 and capsys.readouterr().err == ""

    write_good(tmp_path / "te-9-g1.db", 3)  # no exit recorded for it: it died unseen
    _unclose(tmp_path / "te-9-g1.db")
    assert main(["replay", "verify", str(tmp_path)]) == 3
    out = capsys.readouterr()
    assert out.err.count("\n") == 1 and "the run has no closing record (te-9-g1.db)" in out.err, out.err
    assert "  te-9-g1.db: identical as far as the log goes: " in out.out
    assert main(["replay", "digest", str(tmp_path), "--run", "sim-3"]) == 0
    assert "the run has no closing record (te-9-g1.db)" in capsys.readouterr().err
