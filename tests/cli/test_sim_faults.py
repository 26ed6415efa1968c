"""A scenario's fault plan (`[[faults]]`): an incident run as a simulation from the CLI (a tour:
`faults: unknown key`, faults in virtual time only through Python). The faults are logged
inputs, the log verifies, a split run gives each worker its servers' faults, and a bad fault is
one line naming its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

PD = """name = "pd-incident"
[cluster]
mode = "pd"
[workload]
requests = 40
rps_scale = 2.0
"""


def _fault(at_s: float, kind: str, target: str, **extra: object) -> str:
    more = "".join(f"{k} = {json.dumps(v)}\n" for k, v in extra.items())
    return f'[[faults]]\nat_s = {at_s}\nkind = "{kind}"\ntarget = "{target}"\n{more}'


def _sim(tmp_path: Path, toml: str, *args: str) -> dict:
    path = tmp_path / "s.toml"
    path.write_text(toml)
    # In this process but for a split run (its workers fork: not from the test runner's process).
    run = deepserve if "--workers" in args else in_process
    res = run("sim", str(path), "--json", *args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_link_down_fails_the_pd_requests_it_cuts_until_the_link_is_up(tmp_path: Path) -> None:
    clean = _sim(tmp_path, PD, "--log", "none")
    down = _sim(tmp_path, PD + _fault(5.0, "link-down", "s0/npu0/roce"), "--log", "down.db")
    repaired = _sim(tmp_path, PD + _fault(5.0, "link-down", "s0/npu0/roce") + _fault(8.0, "link-up", "s0/npu0/roce"),
                    "--log", "none")  # fmt: skip
    assert clean["completed"] == 40 and clean["failed"] == 0
    assert down["failed"] > 0 and down["completed"] + down["failed"] == 40
    assert 0 < repaired["failed"] < down["failed"]  # only those inside the outage
    assert repaired["completed"] + repaired["failed"] == 40
    res = in_process("replay", "verify", "down.db", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("identical"), res.stdout + res.stderr
    log = in_process("replay", "log", "down.db", "--actor", "hw/fabric", "--since", "5", "--until", "5", cwd=tmp_path)
    assert "ext/fault→hw/fabric  LinkDown" in log.stdout, log.stdout[:2000]
    # why names the fault beside a request it failed (it came before the request: the last few do)
    why = in_process("replay", "why", "down.db", "r20", cwd=tmp_path).stdout.splitlines()
    assert why[0].startswith("request r20: failed (") and "transfer failed: link s0/npu0/roce is down" in why[0]
    assert why[1] == "t=5.000000  FAULT (ext/fault) -> hw/fabric: LinkDown link=s0/npu0/roce", why


def test_a_split_run_gives_each_worker_its_servers_faults(tmp_path: Path) -> None:
    """16 TEs on 2 servers, an NPU of the second crashing: split over 2 workers, the results are
    the one-process run's behind the same dispatcher (a split run has no gateway nor JE)."""
    toml = ('name = "crash"\n[cluster]\ntes = 16\n[workload]\nrequests = 64\nrps_scale = 4.0\n'
            + _fault(3.0, "npu-crash", "hw/s1/npu2"))  # fmt: skip
    one = _sim(tmp_path, toml, "--log", "none", "--set", "scheduling.entry=dispatcher")
    (tmp_path / "split").mkdir()
    two = _sim(tmp_path, toml, "--log", "split", "--workers", "2")
    assert one["failed"] > 0
    for key in ("completed", "failed", "ttft_ms_p50", "tpot_ms_p50"):
        assert one[key] == two[key], key


@pytest.mark.parametrize(
    ("fault", "needles"),
    [
        (_fault(1.0, "link-down", "s0/npu9/roce"), ["faults.0.target: no link 's0/npu9/roce'"]),
        (_fault(1.0, "npu-crash", "hw/s7/npu0"), ["faults.0.target: no NPU 'hw/s7/npu0'"]),
        (_fault(1.0, "hbm-fault", "hw/s0/npu0", region="r0"), ["faults.0.region", "got 'r0'"]),
        (_fault(1.0, "link-down", "s0/npu0/roce", bw_factor=0.5), ["faults.0.bw_factor: only for link-degrade"]),
        (_fault(1.0, "link-flap", "s0/npu0/roce", up_s=1.0), ["faults.0.down_s: required for link-flap"]),
        (_fault(1.0, "melt", "hw/s0/npu0"), ["faults.0.kind"]),
        (_fault(-1.0, "npu-crash", "hw/s0/npu0"), ["faults.0.at_s", ">= 0.0"]),
    ],
)
def test_a_bad_fault_is_one_line_naming_its_field(tmp_path: Path, fault: str, needles: list[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(PD + fault)
    res = in_process("sim", str(path), "--log", "none", cwd=tmp_path)
    assert_one_line_error(res, *needles)
