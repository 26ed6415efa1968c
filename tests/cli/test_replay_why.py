"""`deepserve replay why LOG REQUEST_ID` from the CLI, on a log of gateway -> JE -> TEs with a
failed task, a prefill refusal and a combined-policy decision (heatmap cell, prefix, loads)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, in_process

sys.path.insert(0, str(Path(__file__).parent.parent / "actors" / "je"))
from je_fakes import ScriptedTe  # noqa: E402

from deepserve.actors.flowserve.messages import Prompt, Sampling  # noqa: E402
from deepserve.actors.gateway.actor import Gateway  # noqa: E402
from deepserve.actors.gateway.messages import ApiRequest  # noqa: E402
from deepserve.actors.je.actor import JobExecutor  # noqa: E402
from deepserve.actors.je.messages import CancelJob, JobRequest, TeGroupMembership  # noqa: E402
from deepserve.core import SimDriver  # noqa: E402
from deepserve.persistence import open_sink  # noqa: E402

HEAT = {"prefill_edges": [0, 1000], "ratio_edges": [0.0], "values": [[-1.0], [0.5]]}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("why") / "run.db"
    sink = open_sink(str(path), "async")
    d = SimDriver(4, sink=sink)
    tes = {"c/0": {"behaviour": "fail_early"}, "c/1": {}, "p/0": {"behaviour": "reject_first", "n": 1},
           "p/1": {}, "d/0": {}}
    for addr, kw in tes.items():
        d.spawn(addr, ScriptedTe, **kw)
    cfg = {"policy": "combined", "heatmap": HEAT, "params": {"threshold": 8},
           "forwarding": {"retry_backoff_s": 0.01}}
    for je in ("je/0", "je/1"):
        d.spawn(je, JobExecutor, config=cfg)
        for role, members in {"colocated": ("c/0", "c/1"), "prefill": ("p/0", "p/1"), "decode": ("d/0",)}.items():
            d.inject(je, TeGroupMembership(model="m", role=role, tes=members), at=0.0)  # type: ignore[arg-type]
    d.spawn("gw", Gateway, config={"jes": ["je/0", "je/1"]})
    for i, n in enumerate((500, 4000, 500)):  # short prompt -> colocated; long -> PD (heatmap)
        d.inject("gw", ApiRequest(request_id=f"r{i}", model="m", prompt=Prompt(num_tokens=n, block_hashes=(1, 2, 3)),
                                  sampling=Sampling(max_tokens=4, target_output_tokens=4), reply_to="ext/client"),
                 at=0.01 + i, corr=f"r{i}")
    for je in ("je/0", "je/1"):  # r2's client gives up (the daemon's TTFT deadline does this)
        d.inject(je, CancelJob(request_id="r2", reason="no first token within 0.01 s (TTFT deadline)"),
                 at=2.02, corr="r2")
    d.run(until=30.0)
    sink.close()
    return path


def test_why_prints_the_path_and_the_numbers_that_decided(log: Path, tmp_path: Path) -> None:
    res = in_process("replay", "why", str(log), "r0", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("request r0: completed")
    assert "gateway gw: admitted" in out and "drawn at random" in out
    assert "policy combined (default_decode_tokens=256, subgroup_load_bound=4, threshold=8)" in out
    assert "heatmap cell prefill>=0 ratio>=0 = -1.000" in out
    assert "task r0/chat.1 on c/0 failed: failed on c/0: NPU crashed" in out
    assert "r0/chat.2 -> c/1" in out and "<- chosen" in out


def test_why_shows_the_pd_hops_and_the_refusal(log: Path, tmp_path: Path) -> None:
    out = in_process("replay", "why", str(log), "r1", cwd=tmp_path).stdout
    assert "= +0.500" in out and "p/0 refused r1/prefill.1: queue full: no free slot; busy" in out
    # the decode is named after the prefill that took the task (prefill.2): the merge follows it
    assert "policy on_demand" in out and "decode task r1/decode.2 -> d/0" in out


def test_why_tells_the_whole_decision(log: Path, tmp_path: Path) -> None:
    """Issue 29 §4: the colocated TEs of a PD decision were missing, a tie looked like a win."""
    out = in_process("replay", "why", str(log), "r1", cwd=tmp_path).stdout
    first = out.split("r1/prefill.1 -> p/0")[1].split("refused")[0]
    assert "not ranked: c/0          colocated not in the chosen subgroup (pd)" in first
    assert "not ranked: c/1          colocated not in the chosen subgroup (pd)" in first
    assert "= tie with the chosen" in first
    assert "tie with the runner-up p/1 on prefix_blocks, load: broken by TE name" in first
    offer = out.split("policy on_demand")[1]
    assert "not ranked: p/0          pd        refused this sweep (busy)" in offer


def test_why_shows_waits_and_the_policys_queued_choice(tmp_path: Path) -> None:
    """A task queued behind older prefill tasks: the policy's own choice and the wait."""
    from deepserve.persistence import open_log
    from deepserve.replay.why import request_hops, why_lines

    path = tmp_path / "queued.db"
    sink = open_sink(str(path), "async")
    d = SimDriver(5, sink=sink)
    for addr, kw in {"c/0": {}, "p/0": {"behaviour": "reject"}, "d/0": {}}.items():
        d.spawn(addr, ScriptedTe, **kw)
    d.spawn("je/0", JobExecutor, config={"policy": "round_robin", "forwarding": {"ttft_deadline_s": 0.5}})
    for role, members in {"colocated": ("c/0",), "prefill": ("p/0",), "decode": ("d/0",)}.items():
        d.inject("je/0", TeGroupMembership(model="m", role=role, tes=members), at=0.0)  # type: ignore[arg-type]
    for i in range(4):
        d.inject("je/0", JobRequest(request_id=f"r{i}", model="m", prompt=Prompt(num_tokens=300),
                                    sampling=Sampling(max_tokens=4), reply_to="ext/client"), at=0.01 * (i + 1))
    d.run(until=5.0)
    sink.close()
    out = "\n".join(why_lines(request_hops(open_log(str(path), upgrade=False), "r3")))
    assert "JE je/0: the policy chose p/0 (pd) [policy round_robin (turn=3)]; queued, not offered: " \
           "1 prefill tasks wait before it" in out
    assert "je/0: waits in the JE (1 prefill tasks wait before it)" in out
    assert "request r3: failed (timeout: TTFT deadline 0.5s" in out


def test_why_json_has_every_hop_with_the_decision_inputs(log: Path, tmp_path: Path) -> None:
    res = in_process("replay", "why", str(log), "r1", "--json", cwd=tmp_path)
    data = json.loads(res.stdout)
    kinds = [h["event"] for h in data["hops"]]
    assert kinds[0] == "GatewayRouted" and kinds[-1] == "JobFinished"
    first = next(h for h in data["hops"] if h["event"] == "RouteDecided")
    assert first["decision"]["heatmap_cell"]["value"] == 0.5
    assert {r["te"] for r in first["decision"]["ranked"]} == {"p/0", "p/1"}


def test_why_unknown_request_is_exit_2_saying_how_to_find_ids(log: Path, tmp_path: Path) -> None:
    res = in_process("replay", "why", str(log), "nope", cwd=tmp_path)
    assert_one_line_error(res, "no request 'nope'", "(requests: r0, r1, r2)")


def test_why_shows_when_the_client_gave_up(log: Path, tmp_path: Path) -> None:
    """A tour: a request cancelled at its TTFT deadline showed only its end, seconds later
    (when its TE answered the cancel), not the moment the client was told 504."""
    out = in_process("replay", "why", str(log), "r2", cwd=tmp_path).stdout
    cancel = [line for line in out.splitlines() if "cancel requested" in line]
    assert cancel == ["t=2.020000  je/0: cancel requested: no first token within 0.01 s (TTFT deadline); "
                      "cancelling its task"], out


def test_why_on_a_simulation_log_shows_the_platform_hops(tmp_path: Path) -> None:
    """`deepserve sim` runs the whole platform: the gateway's admission and JE draw, the JE's
    routing decisions with their inputs, the P/D prefill's end and the terminal record."""
    log = tmp_path / "pd.db"
    assert in_process("sim", "pd-1p1d", "--requests", "3", "--log", str(log), cwd=tmp_path).returncode == 0
    lines = in_process("replay", "why", str(log), "r1", cwd=tmp_path).stdout.splitlines()
    assert lines[0].startswith("request r1: completed (length) — TTFT ")
    assert "gateway: admitted" in lines[1] and "JE je/0 drawn at random" in lines[1]
    assert "JE je/0: prefill task r1/prefill.1 -> te/0 [policy load_aware" in lines[2]
    assert any("je/0: prefill done" in ln for ln in lines) and lines[-1].endswith("je/0: completed on te/1: length")


def test_why_on_a_dispatcher_simulation_log_shows_the_workload_hops(tmp_path: Path) -> None:
    """`scheduling.entry = "dispatcher"` drives TEs through the workload stand-in: its
    dispatches, the P/D prefill's end and the terminal record are the hops (no gateway or JE)."""
    log = tmp_path / "pd.db"
    assert in_process("sim", "pd-1p1d", "--requests", "3", "--log", str(log), "--set", "scheduling.entry=dispatcher",
                      cwd=tmp_path).returncode == 0  # fmt: skip
    res = in_process("replay", "why", str(log), "r1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("request r1: completed (length) — TTFT ")
    assert "prefill task attempt 1 -> te/0/dp/0" in lines[1]
    assert "prefill done (0 prompt tokens cached)" in lines[2]
    assert "decode task attempt 1 -> te/1/dp/0" in lines[3]
    assert lines[4].endswith("completed on te/1: length") and len(lines) == 5
    missing = in_process("replay", "why", str(log), "r9", cwd=tmp_path)
    assert_one_line_error(missing, "no request 'r9' in run", "(requests: r0, r1, r2)")
