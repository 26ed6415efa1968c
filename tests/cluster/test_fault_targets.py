"""A fault names a TE or a JE the cluster has (issue 31 §2): `check` hands `check_faults` the
cluster's real addresses — the TEs it starts with (every group's, numbered across groups; a
spare slot is never started) and its JEs — so a `kill-te`, `kill-te-process`, `heartbeat-loss`
or `kill-je` aimed at one that does not exist is refused naming the key (exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliproc import in_process

from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.cluster.config import load

# 2 colocated TEs (te/0, te/1), a spare slot (te/2), a 1P1D pool (te/3, te/4), two JEs
CLUSTER = """name = "targets"
[cluster]
tes = 2
[pd]
prefill_tes = 1
decode_tes = 1
[scheduling]
jes = 2
"""


def _fault(kind: str, target: str) -> str:
    extra = ", duration_s = 5.0" if kind == "heartbeat-loss" else ""
    return f"faults=[{{at_s = 1.0, kind = '{kind}', target = '{target}'{extra}}}]"


@pytest.mark.parametrize(("kind", "target", "says"), [
    ("kill-te", "te/9", "no TE 'te/9' in this cluster (te/0, te/1, te/3, te/4)"),
    ("kill-te-process", "te/2", "no TE 'te/2'"),  # the spare slot: never started
    ("heartbeat-loss", "te/5", "no TE 'te/5'"),
    ("kill-je", "je/2", "no JE 'je/2' in this cluster (je/0, je/1)"),
])  # fmt: skip
def test_a_fault_on_a_missing_te_or_je_is_refused_naming_the_key(tmp_path: Path, kind: str, target: str,
                                                                 says: str) -> None:  # fmt: skip
    (tmp_path / "t.toml").write_text(CLUSTER)
    with pytest.raises(ScenarioError) as info:
        load(str(tmp_path / "t.toml"), [_fault(kind, target)])
    assert "faults.0.target" in str(info.value) and says in str(info.value), str(info.value)


def test_faults_on_the_started_tes_and_jes_load(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text(CLUSTER)
    for kind, target in (("kill-te", "te/4"), ("kill-te-process", "te/0"), ("heartbeat-loss", "te/3"),
                         ("kill-je", "je/1")):  # fmt: skip
        assert load(str(tmp_path / "t.toml"), [_fault(kind, target)]).faults[0].target == target


def test_a_dispatcher_run_has_no_je_to_kill(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text(CLUSTER.replace("jes = 2", 'jes = 2\nentry = "dispatcher"'))
    with pytest.raises(ScenarioError, match=r"faults\.0\.target.*no JE 'je/0' in this cluster \(none\)"):
        load(str(tmp_path / "t.toml"), [_fault("kill-je", "je/0")])


def test_sim_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "t.toml").write_text(CLUSTER)
    res = in_process("sim", "t.toml", "--set", _fault("kill-te", "te/7"), "--json", cwd=tmp_path)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "faults.0.target" in res.stderr, res.stderr
