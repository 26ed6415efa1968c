"""`deepserve sim example` and the replay commands on its log, end to end (in this process, but
for the runs under their own PYTHONHASHSEED whose digests must agree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


def test_sim_example_writes_its_log_and_it_verifies(runs: Path) -> None:
    res = in_process("sim", "example", cwd=runs)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    log = runs / "runs" / "example-0.db"
    assert log.is_file()
    assert res.stdout.rstrip().endswith("log: runs/example-0.db")
    for word in ("deliveries", "virtual time", "actors", "jobs done", "failures", "dead letters"):
        assert word in res.stdout, word

    res = in_process("replay", "verify", str(log), cwd=runs)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("identical: 6 actors, ")


def test_sim_json_summary_is_one_object(runs: Path) -> None:
    # Seed 2 retires worker/0 while a job timer of its is pending: one dead letter.
    res = in_process("sim", "example", "--seed", "2", "--log", "s2.db", "--json", cwd=runs)
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    summary = json.loads(line)
    assert summary["jobs_done"] == summary["jobs"] == 200
    assert summary["failures"] > 0 and summary["dead_letters"] > 0 and summary["retries"] > 0
    assert summary["log"] == "s2.db" and (runs / "s2.db").is_file()
    listing = in_process("replay", "log", "s2.db", "--json", cwd=runs)
    dead = [r for r in map(json.loads, listing.stdout.splitlines()) if r.get("kind") == "dead"]
    assert len(dead) == summary["dead_letters"]


def test_digests_equal_for_a_seed_and_differ_between_seeds(runs: Path) -> None:
    digests = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        res = deepserve("sim", "example", "--seed", seed, "--log", f"{name}.db", cwd=runs, hashseed=seed)
        assert res.returncode == 0, res.stderr
        res = in_process("replay", "digest", f"{name}.db", cwd=runs)
        assert res.returncode == 0, res.stderr
        digests[name] = res.stdout.strip()
    assert digests["a"] == digests["b"]
    assert digests["a"] != digests["c"]
    res = in_process("replay", "digest", "a.db", "--json", cwd=runs)
    assert json.loads(res.stdout) == {"digest": digests["a"]}


def test_rerunning_replaces_the_log_and_refuses_to_clobber_other_files(runs: Path) -> None:
    for _ in range(2):
        assert in_process("sim", "example", "--log", "again.db", "--requests", "20", cwd=runs).returncode == 0
    res = in_process("replay", "verify", "again.db", "--json", cwd=runs)
    assert json.loads(res.stdout)["identical"] is True
    precious = runs / "notes.txt"
    precious.write_text("mine\n")
    res = in_process("sim", "example", "--log", str(precious), cwd=runs)
    assert_one_line_error(res, "not a deepserve log", "not replacing")
    assert precious.read_text() == "mine\n"


def test_replay_state_log_and_filters(runs: Path) -> None:
    assert in_process("sim", "example", "--seed", "5", "--log", "f.db", cwd=runs).returncode == 0
    res = in_process("replay", "state", "f.db", "--actor", "dispatch", "--json", cwd=runs)
    assert res.returncode == 0, res.stderr
    final = json.loads(res.stdout)
    assert final["alive"] and final["state"]["done"] == 200 and final["at"] is None
    res = in_process("replay", "state", "f.db", "--actor", "dispatch", "--at", "10", "--json", cwd=runs)
    early = json.loads(res.stdout)
    assert early["t"] <= 10 and 0 < early["state"]["done"] < 200

    res = in_process("replay", "state", "f.db", "--actor", "worker/0", cwd=runs)
    assert res.returncode == 0 and "stopped" in res.stdout.splitlines()[0]

    res = in_process("replay", "log", "f.db", "--corr", "job-7", cwd=runs)
    assert res.returncode == 0, res.stderr
    heads = [line for line in res.stdout.splitlines() if not line.startswith(" " * 16)]
    assert heads and all("corr=job-7" in line for line in heads)
    assert any("SubmitJob" in line for line in heads) and any("JobDone" in line for line in heads)

    res = in_process("replay", "log", "f.db", "--actor", "worker/1", "--since", "5", "--until", "9", "--json", cwd=runs)
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert rows and all(r["actor"] == "worker/1" and 5 <= r["t"] <= 9 for r in rows)
    assert all({"events", "outputs", "payload", "seq", "src", "type"} <= r.keys() for r in rows)


def test_help_for_every_command(runs: Path) -> None:
    for args in (
        [], ["sim"], ["replay"], ["replay", "verify"], ["replay", "state"], ["replay", "log"],
        ["replay", "digest"],
    ):
        res = in_process(*args, "--help", cwd=runs)
        assert res.returncode == 0, (args, res.stderr)
        assert res.stdout.startswith("usage: deepserve"), args
