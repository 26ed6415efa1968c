"""`deepserve replay whatif` on a simulation's log (issue 32 §1, §2): the original column is the
run's own `sim --json` summary, a what-if with no change is the run again (same digest), a
forwarding and a recovery change each show in numbers what they change, a fork at the routing
decision of a request retried after a TE failure plays the other choice out, and bad input is
exit 2 with one line. The shipped incident's first 250 requests (both faults land in them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cliproc import in_process

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")
WALL_KEYS = ("wall_s", "sim_requests_per_wall_s", "log")  # what a run's wall clock and its file name change


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("whatif")
    log = tmp / "incident.db"
    res = in_process("sim", SCENARIO, "--requests", "250", "--json", "--log", str(log), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), log


def whatif(log: Path, *args: str) -> dict[str, Any]:
    res = in_process("replay", "whatif", str(log), "--json", *args, cwd=log.parent)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    keys = (set(a) | set(b)) - set(WALL_KEYS) - {"scaling_actions"}
    assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}


def test_the_original_column_is_the_runs_own_summary_and_no_change_reruns_it(run: tuple[dict[str, Any], Path]) -> None:
    summary, log = run
    out = whatif(log, "--log", str(log.parent / "again.db"))
    same(out["original"], summary)
    same(out["whatif"], summary)
    assert out["first_difference"] is None and out["changes"] == []
    digests = [in_process("replay", "digest", str(p), cwd=log.parent).stdout for p in (log, log.parent / "again.db")]
    assert digests[0] == digests[1] and len(digests[0].strip()) == 64


def test_a_forwarding_change_shows_what_it_changes(run: tuple[dict[str, Any], Path]) -> None:
    summary, log = run
    out = whatif(log, "--set", "scheduling.forwarding.accept_timeout_s=0.5")
    same(out["original"], summary)
    a, b = out["original"], out["whatif"]
    assert a["requests"] == b["requests"] == 250
    assert (a["deliveries"], a["ttft_ms_p99"]) != (b["deliveries"], b["ttft_ms_p99"])
    diff = out["first_difference"]
    assert diff is not None and diff["actor"].startswith("je/") and diff["original"] != diff["whatif"]
    assert diff["t"] > 60.0  # nothing parts before the killed TE's silence


def test_a_recovery_change_shows_later_detection(run: tuple[dict[str, Any], Path]) -> None:
    _, log = run
    out = whatif(log, "--set", "control.heartbeat_misses=6")
    kill = [(f["detected_after_s"], g["detected_after_s"]) for f, g in zip(out["original"]["faults"],
                                                                         out["whatif"]["faults"], strict=True)
            if f["kind"] == "kill-te"]  # fmt: skip
    assert kill == [(3.0, 6.0)]  # heartbeat_misses x 1 s interval
    assert out["whatif"]["e2e_ms_p99"] > out["original"]["e2e_ms_p99"]
    assert out["first_difference"]["t"] > 60.0


def test_at_decision_forks_a_request_retried_after_a_te_failure(run: tuple[dict[str, Any], Path]) -> None:
    _, log = run
    why = in_process("replay", "why", str(log), "r143", cwd=log.parent)
    assert "decision id r143/prefill.2" in why.stdout  # retried after te/5's kill
    out = whatif(log, "--at-decision", "r143/prefill.2", "--choose", "te/3")
    diff = out["first_difference"]
    assert (diff["actor"], diff["about"]) == ("je/0", "r143/prefill.2")
    assert (diff["original"], diff["whatif"]) == ("r143/prefill.2 -> te/4", "r143/prefill.2 -> te/3")
    req = out["request"]
    assert req["request_id"] == "r143" and req["original"]["status"] == req["whatif"]["status"] == "completed"
    assert req["original"]["cached_prompt_tokens"] != req["whatif"]["cached_prompt_tokens"]  # te/3 had no prefix


@pytest.mark.parametrize(("args", "says"), [
    (("--set", "control.bogus=1"), "control.bogus: unknown key"),
    (("--set", "workload.requests=5"), "workload is not a setting"),
    (("--at-decision", "r999999/chat.1", "--choose", "te/0"), "no routing decision with this id"),
    (("--at-decision", "r143/prefill.2", "--choose", "te/9"), "not a candidate of decision r143/prefill.2"),
    (("--at-decision", "r143/prefill.2"), "--at-decision and --choose go together"),
])  # fmt: skip
def test_bad_input_is_one_line(run: tuple[dict[str, Any], Path], args: tuple[str, ...], says: str) -> None:
    _, log = run
    res = in_process("replay", "whatif", str(log), *args, cwd=log.parent)
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_a_file_that_is_not_a_log_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "x.db"
    bad.write_text("not a log")
    res = in_process("replay", "whatif", str(bad), cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_from_t_with_no_change_is_the_run(run: tuple[dict[str, Any], Path]) -> None:
    summary, log = run
    out = whatif(log, "--from", "40")
    same(out["whatif"], summary)
    assert out["first_difference"] is None


def test_from_t_applies_the_change_from_t_on_the_verified_state(run: tuple[dict[str, Any], Path]) -> None:
    _, log = run
    res = in_process("replay", "whatif", str(log), "--from", "40", "--set", "control.heartbeat_misses=6", cwd=log.parent)
    assert res.returncode == 0, res.stderr
    assert "--from 40: restored from the log at t=40 (" in res.stdout and "not re-run" in res.stdout
    assert "rebuilt with the change: cluster/heartbeat" in res.stdout
    out = whatif(log, "--from", "40", "--set", "control.heartbeat_misses=6")
    kill = [(f["detected_after_s"], g["detected_after_s"]) for f, g in zip(out["original"]["faults"],
                                                                         out["whatif"]["faults"], strict=True)]  # fmt: skip
    assert kill == [(1.0, 1.0), (3.0, 6.0)]  # the crash at 30 s as it was; the kill at 60 s under the change
    assert out["first_difference"]["t"] > 60.0


@pytest.mark.parametrize(("args", "says"), [
    (("--from", "1e9"), "the run goes from 0 to"),
    (("--from", "40", "--set", "scheduling.jes=2"), "adds or removes actors"),
    (("--from", "40", "--at-decision", "r143/prefill.2", "--choose", "te/3"), "give one"),
])  # fmt: skip
def test_bad_from_is_one_line(run: tuple[dict[str, Any], Path], args: tuple[str, ...], says: str) -> None:
    _, log = run
    res = in_process("replay", "whatif", str(log), *args, cwd=log.parent)
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_an_incident_bundle_is_read_as_its_log(run: tuple[dict[str, Any], Path]) -> None:
    summary, log = run
    bundle = log.parent / "incident.tar.gz"
    made = in_process("replay", "bundle", str(log), "-o", str(bundle), cwd=log.parent)
    assert made.returncode == 0, made.stderr
    out = whatif(bundle, "--set", "control.heartbeat_misses=6")
    same(out["original"], {**summary, "log": out["original"]["log"]})
    assert out["whatif"]["e2e_ms_p99"] != out["original"]["e2e_ms_p99"]


def test_a_dispatcher_run_is_refused_in_one_line(tmp_path: Path) -> None:
    log = tmp_path / "d.db"
    res = in_process("sim", SCENARIO, "--requests", "20", "--set", "scheduling.entry=dispatcher", "--set", "faults=[]",
                     "--log", str(log), "--json", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = in_process("replay", "whatif", str(log), cwd=tmp_path)
    assert res.returncode == 2 and "workload dispatcher" in res.stderr and len(res.stderr.strip().splitlines()) == 1
