"""The daemon's `[control]` and `[scheduling]` sections: validated with an error naming the key
(exit 2, one line)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cliproc import in_process

from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.daemon.config import load_config


@pytest.mark.parametrize(("setting", "key"), [
    ("control.heartbeat_misses=0", "heartbeat_misses: must be in [1, 1000]"),
    ("control.heartbeat_interval_s=0", "heartbeat_interval_s: must be in (0, 3600]"),
    ("control.heartbeat_timeout_s=2.0", "heartbeat_timeout_s: must be >= 0 and below heartbeat_interval_s"),
    ("control.spare_tes=-1", "spare_tes"),
    ("control.pods=1", "control.pods: unknown key"),
    ("cluster.scheduler.aggregate=true", "cluster.scheduler.aggregate: must be false: the daemon steps every "
                                         "decode pass"),
])  # fmt: skip
def test_bad_control_settings_name_the_key(setting: str, key: str, tmp_path: Path) -> None:
    r = in_process("config", "show", "--set", setting, cwd=tmp_path)  # `main()` here: no process start
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and key in r.stderr, r.stderr


def test_aggregate_is_refused_for_streaming_not_heartbeats() -> None:
    """The daemon streams each decode pass's tokens, so it runs no aggregated decode whatever the
    heartbeats (which work beside aggregated runs): asked for one with heartbeats off, it still
    says so naming the key (it was taken and quietly turned off before)."""
    with pytest.raises(ScenarioError) as exc:
        load_config(None, ("control.heartbeats=false", "cluster.scheduler.aggregate=true"))
    assert ("--set cluster.scheduler.aggregate=true: cluster.scheduler.aggregate: must be false: the daemon "
            "steps every decode pass") in str(exc.value)  # fmt: skip


def test_the_daemon_sets_aggregate_false_itself_with_heartbeats_on() -> None:
    cfg = load_config(None, ("control.heartbeats=true", "groups=[{model = 'llama2-7b', tes = 1, kv_block_tokens = 16}]"))
    assert not cfg.cluster.scheduler.aggregate and not cfg.groups[0].scheduler.aggregate


def test_the_resolved_config_shows_the_control_plane(tmp_path: Path) -> None:
    r = in_process("config", "show", cwd=tmp_path)
    assert r.returncode == 0 and "[control]\nheartbeats = true\nheartbeat_interval_s = 1.0\nheartbeat_misses = 3" in r.stdout


@pytest.mark.parametrize(("setting", "says"), [
    ("scheduling.policy=nope", "scheduling.policy: Invalid enum value 'nope'"),
    ("scheduling.params.x=1", "scheduling.params.x: not a parameter of load_aware (it has: threshold)"),
    ("scheduling.jes=0", "scheduling.jes: Expected `int` >= 1"),
    ("scheduling.entry=dispatcher", "scheduling.entry: the daemon's requests enter through the gateway"),
    ("scheduling.heatmap=/no/such/file", "scheduling.heatmap: cannot read /no/such/file"),
])  # fmt: skip
def test_bad_scheduling_settings_name_the_key(setting: str, says: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        load_config(None, (setting,))
    assert says in str(exc.value) and f"--set {setting}" in str(exc.value)


def test_the_scheduling_section_reaches_the_je_config() -> None:
    cfg = load_config(None, ("scheduling.policy=load_aware", "scheduling.params.threshold=2"))
    sch = cfg.scheduling
    assert (sch.policy, sch.params, sch.jes) == ("load_aware", {"threshold": 2}, 1)
    assert load_config().scheduling.policy == "load_aware"  # the default (docs/scheduling.md: measured best)


def test_a_config_file_names_only_what_it_changes(tmp_path: Path) -> None:
    """A user's file is layered over the default (a tour found that `[daemon] port = 9000`
    alone was refused for keys it never wrote: it was validated over the schema's defaults)."""
    f = tmp_path / "mine.toml"
    f.write_text("[daemon]\nport = 9000\n\n[cluster]\ntes = 3\n")
    cfg, default = load_config(str(f)), load_config()
    assert cfg.daemon.port == 9000 and cfg.cluster.tes == 3
    assert cfg.cluster.scheduler == default.cluster.scheduler  # the rest as the default says
    assert cfg.control == default.control
    f.write_text("[daemon]\nport = -5\n")
    with pytest.raises(ScenarioError) as info:
        load_config(str(f))
    assert str(info.value).startswith(f"{f}: daemon.port: ")  # the file that set it
    with pytest.raises(ScenarioError) as info:
        load_config(str(f), ("daemon.port=-1",))
    assert str(info.value).startswith("--set daemon.port=-1: daemon.port: ")
