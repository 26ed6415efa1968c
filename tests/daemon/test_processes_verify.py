"""`deepserve replay verify RUN_DIR` over a run directory with one log per process: each log is
re-executed on its own and reported on its own line; one diverged log makes the exit status 1
and is named, the others still say identical. (The live `--processes` test verifies a real run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_processes_launcher import launch

from deepserve.cli.main import main
from deepserve.core import SimDriver
from deepserve.daemon.procs.launcher import ProcessPods
from deepserve.daemon.procs.messages import ProcessExited, ProcessUp
from deepserve.persistence import open_sink

REPLAY_TESTS = Path(__file__).resolve().parent.parent / "replay"  # divactors: actors that break the rules


def write_good(path: Path, seed: int, run_id: str = "sim-3") -> None:
    """A well-behaved process log: the launcher taking a launch, an up and an exit. Every log of
    the directory belongs to one run (`sim-3`, the id divactors' driver gives its run)."""
    d = SimDriver(seed, sink=open_sink(str(path), "async"), run_id=run_id)
    d.spawn("pods", ProcessPods)
    d.inject("pods", launch(), at=1.0)
    d.inject("pods", ProcessUp(pod_id="te/0#g1", pid=9, endpoint="ipc:///x", log=""), at=2.0, src="ext/supervisor")
    d.inject("pods", ProcessExited(pod_id="te/0#g1", pid=9, returncode=-9), at=3.0, src="ext/supervisor")
    d.run()
    d.snapshot_live()
    d.sink.close()  # type: ignore[union-attr]


def verify_dir(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", "verify", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_each_log_of_a_run_directory_is_verified_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    write_good(tmp_path / "daemon.db", 1)
    write_good(tmp_path / "te-0-g1.db", 2)
    code, out, err = verify_dir(capsys, str(tmp_path))
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith("identical: 2 actors, ") and lines[0].endswith("(run 'sim-3'); 2 logs, each verified on its own")
    assert [ln.split(":")[0] for ln in lines[1:]] == ["  daemon.db", "  te-0-g1.db"] and out.count(": identical:") == 2

    monkeypatch.syspath_prepend(str(REPLAY_TESTS))
    import divactors

    divactors.write_log(str(tmp_path / "te-1-g1.db"), "clock")  # reads the wall clock: re-execution differs
    code, out, err = verify_dir(capsys, str(tmp_path))
    assert code == 1 and not err, out + err
    assert out.splitlines()[0] == "diverged: 1 of 3 logs (run 'sim-3')"
    assert "  te-1-g1.db: diverged: suspect#4" in out and out.count(": identical:") == 2
    code, out, _ = verify_dir(capsys, str(tmp_path), "--json")
    report = json.loads(out)
    assert code == 1 and [v["result"]["identical"] for v in report["logs"]] == [True, True, False]
    assert not report["identical"] and report["divergence"]["actor"] == "suspect" and report["run_id"] == "sim-3"

    code, out, err = verify_dir(capsys, str(tmp_path), "--run", "nope")
    assert code == 2 and err.count("\n") == 1 and "no log holds run 'nope'" in err

    write_good(tmp_path / "other.db", 4, "sim-9")  # another run's file: the merged reading refuses to guess
    code, out, err = verify_dir(capsys, str(tmp_path))
    assert code == 2 and "2 runs" in err and "--run" in err, err


def test_a_run_directory_missing_a_process_log_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """daemon.db records the launcher's `SpawnProcess` for te/0#g1: without te-0-g1.db the
    directory is not the whole run, and every replay command refuses it naming the file (it
    verified `identical` on what was left, and `replay log` dropped the TE's lines: a user tour)."""
    write_good(tmp_path / "daemon.db", 1)
    write_good(tmp_path / "other-process.db", 2)  # a second file: the per-process reading
    for cmd in (["verify"], ["digest"], ["log", "--actor", "pods"]):
        code = main(["replay", *cmd, str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and "the run wrote te-0-g1.db, which the directory lacks" in err, err
    write_good(tmp_path / "te-0-g1.db", 3)
    assert main(["replay", "verify", str(tmp_path)]) == 0, capsys.readouterr()
