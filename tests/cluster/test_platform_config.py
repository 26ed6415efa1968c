"""One config for `sim` and `up` (cluster/schema.py, cluster/config.py): every shipped file
loads for both commands, a bad group names its dotted key and the file or override, the layout
numbers TEs across groups, and each driver sets what it needs instead of refusing a file."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

import pytest
from cliproc import in_process

from deepserve.adapters.scenario.loader import ScenarioError, builtin_names
from deepserve.cluster.config import for_driver, load
from deepserve.cluster.layout import plan

CONFIGS = Path(str(resources.files("deepserve") / "configs"))
SHIPPED = [str(CONFIGS / "daemon" / "default.toml"), *(str(CONFIGS / "scenarios" / f"{n}.toml") for n in builtin_names())]

MIXED = """name = "mixed"
[cluster]
tes = 2
kv_block_tokens = 16
[pd]
prefill_tes = 1
decode_tes = 1
[[groups]]
model = "llama2-7b"
tes = 1
kv_block_tokens = 16
[[faults]]
at_s = 1.0
kind = "npu-crash"
target = "hw/s2/npu0"
"""


@pytest.mark.parametrize("path", SHIPPED)
@pytest.mark.parametrize("command", ["sim", "up"])
def test_every_shipped_file_loads_for_both_commands(path: str, command: str) -> None:
    cfg = for_driver(load(path, (), command), command)  # type: ignore[arg-type]
    assert plan(cfg).slots


@pytest.mark.parametrize(("extra", "key", "says"), [
    ('[[groups]]\nmodel = "llama2-7b"\ntopology = "cm384"\nhardware = "910c"\nkv_block_tokens = 16\n',
     "groups.1.topology", "must equal cluster.topology ('gen1')"),
    ('[[groups]]\nmodel = "llama2-7b"\nkv_block_tokens = 16\n', "groups.1", "serves llama2-7b/colocated as groups.0 does"),
    ('[[groups]]\nmodel = "llama2-7b"\nmode = "pd"\nkv_block_tokens = 64\n', "groups.1.kv_block_tokens", "one prompt tree"),
    ('[[groups]]\nmodel = "nope"\nkv_block_tokens = 16\n', "groups.1.model", "unknown model 'nope'"),
    ('[workload]\nmodels = ["llama3-70b"]\n', "workload.models.0", "served by no group"),
])  # fmt: skip
def test_a_bad_group_names_its_key_and_file(tmp_path: Path, extra: str, key: str, says: str) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(MIXED + extra)
    with pytest.raises(ScenarioError) as info:
        load(str(f))
    assert str(info.value).startswith(f"{f}: {key}: ") and says in str(info.value), str(info.value)


def test_an_override_of_a_group_is_named(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text(MIXED)
    with pytest.raises(ScenarioError) as info:
        load(str(f), ("scheduling.jes=0",))
    assert str(info.value).startswith("--set scheduling.jes=0: scheduling.jes: ")
    res = in_process("sim", str(f), "--set", "pd.prefill_tes=0", "--log", "none", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "pd.prefill_tes" in res.stderr, res.stderr


def test_the_layout_numbers_tes_across_groups_on_their_own_servers(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text(MIXED)
    layout = plan(load(str(f)))
    rows = [(s.te, s.group, s.server) for s in layout.slots]
    assert rows == [("te/0", "llama3-8b/colocated", 0), ("te/1", "llama3-8b/colocated", 0),
                    ("te/2", "llama3-8b/colocated", 0),  # control.spare_tes = 1: a slot for scaling
                    ("te/3", "llama3-8b/prefill", 1), ("te/4", "llama3-8b/decode", 2),  # RoCE: P and D apart
                    ("te/5", "llama2-7b/colocated", 3)]  # fmt: skip
    assert layout.groups == {"llama3-8b/colocated": 2, "llama3-8b/prefill": 1, "llama3-8b/decode": 1,
                             "llama2-7b/colocated": 1}  # fmt: skip
    assert layout.slots[5].te_config["dps"][0]["model"] == "llama2-7b"


def test_each_driver_sets_what_it_needs(tmp_path: Path) -> None:
    scenario = load("pd-1p1d", (), "up")
    assert scenario.cluster.scheduler.aggregate and not scenario.cluster.scheduler.stream_token_ids  # the file's
    up = for_driver(scenario, "up")
    assert not up.cluster.scheduler.aggregate and up.cluster.scheduler.stream_token_ids
    sim = for_driver(load(None), "sim")  # the daemon's file: steps every iteration, heartbeats on
    assert sim.control.heartbeats and not sim.cluster.scheduler.stream_token_ids
    assert for_driver(scenario, "sim").cluster.scheduler.aggregate  # the simulation's fast path stays


def test_up_takes_a_scenario_whole_and_layers_a_daemon_file(tmp_path: Path) -> None:
    cfg = load(str(CONFIGS / "scenarios" / "pd-1p1d.toml"), (), "up")
    assert cfg.cluster.mode == "pd" and cfg.pd.prefill_tes == 0  # not the default file's [pd] pool
    mine = tmp_path / "mine.toml"
    mine.write_text("[control]\nspare_tes = 0\n")
    layered = load(str(mine), (), "up")
    assert layered.pd.prefill_tes == 1 and layered.cluster.tes == 3 and layered.control.spare_tes == 0


def test_config_show_prints_groups_and_faults_as_toml(tmp_path: Path) -> None:
    f = tmp_path / "m.toml"
    f.write_text('[daemon]\nport = 9000\n' + MIXED.split("\n", 1)[1])  # a daemon file: layered
    res = in_process("config", "show", "--config", str(f), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = tomllib.loads(res.stdout)
    assert doc["groups"][0]["model"] == "llama2-7b" and doc["groups"][0]["scheduler"]["max_running"] == 256
    assert doc["faults"][0]["target"] == "hw/s2/npu0" and doc["scheduling"]["jes"] == 1
