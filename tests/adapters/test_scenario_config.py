"""Scenario files and `--set` overrides: one validation path, errors naming the dotted key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.scenario.loader import (
    ScenarioError,
    builtin_names,
    load_scenario,
    parse_override,
    trace_path,
)
from deepserve.adapters.traces import open_trace


def test_builtin_scenarios_load_as_the_issue_describes() -> None:
    assert {"mooncake-16te", "pd-1p1d"} <= set(builtin_names())
    m = load_scenario("mooncake-16te")
    c = m.cluster
    assert (c.mode, c.tes, c.model, c.hardware, c.tp, c.prefix_caching) == (
        "colocated", 16, "llama3-8b", "910b", 1, True,
    )  # fmt: skip
    p = load_scenario("pd-1p1d").cluster
    assert (p.mode, p.prefill_tes, p.decode_tes, p.link) == ("pd", 1, 1, "roce")


def test_builtin_trace_slices_are_readable() -> None:
    for name, fmt, n in [("azure_conv_500", "azure", 500), ("mooncake_conv_1k", "mooncake", 1000)]:
        trace = open_trace(trace_path(f"builtin:{name}"))
        assert trace.format == fmt and sum(1 for _ in trace) == n


def test_override_changes_only_that_field() -> None:
    base = load_scenario("mooncake-16te")
    s = load_scenario("mooncake-16te", ["cluster.tes=8", "cluster.scheduler.chunked_prefill=false"])
    assert s.cluster.tes == 8 and s.cluster.scheduler.chunked_prefill is False
    assert s.cluster.model == base.cluster.model and s.workload == base.workload


@pytest.mark.parametrize(
    ("override", "source", "key", "problem"),
    [
        ("cluster.tes=0", "--set cluster.tes=0", "cluster.tes", ">= 1"),
        ("cluster.tez=3", "--set cluster.tez=3", "cluster.tez", "unknown key"),
        ("cluster.mode=pdx", "--set cluster.mode=pdx", "cluster.mode", "Invalid enum value 'pdx'"),
        ("cluster.scheduler.max_batch_tokens=abc", "--set cluster.scheduler.max_batch_tokens=abc",
         "cluster.scheduler.max_batch_tokens", "Expected `int`, got `str`"),
        ("cluster.tp=16", "--set cluster.tp=16", "cluster.tp", "a gen1 server has 8"),
        ("cluster.tes.x=1", "--set cluster.tes.x=1", "cluster.tes", "is a value, not a table"),
        ("cluster.model=gpt", "--set cluster.model=gpt", "cluster.model", "unknown model 'gpt'"),
        ("cluster.hardware=910c", "--set cluster.hardware=910c", "cluster.hardware", "does not match"),
        ("workload.rps_scale=0", "--set workload.rps_scale=0", "workload.rps_scale", "> 0"),
        # found by a user tour: every request failed at run time, or the log writer after the run
        ("cluster.tp=3", "--set cluster.tp=3", "cluster.tp", "3 does not divide the 32 attention heads"),
        ("seed=18446744073709551615", "--set seed=18446744073709551615", "seed", "<= 9223372036854775807"),
    ],
)  # fmt: skip
def test_bad_override_names_its_key(override: str, source: str, key: str, problem: str) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario("mooncake-16te", [override])
    err = info.value
    assert (err.source, err.key) == (source, key)
    assert problem in err.problem
    assert str(err).startswith(f"{source}: {key}: ")


@pytest.mark.parametrize("item", ["x", "=3", "cluster..tes=1", "1a=2"])
def test_malformed_set_item(item: str) -> None:
    with pytest.raises(ScenarioError, match="expected KEY=VALUE"):
        parse_override(item)


def test_set_values_read_as_toml() -> None:
    assert parse_override("a.b=8") == ("a.b", 8)
    assert parse_override("a=2.5") == ("a", 2.5)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=pd") == ("a", "pd")
    assert parse_override('a="x y"') == ("a", "x y")


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[cluster]\ntes = -1\n", "cluster.tes", ">= 1"),
        ("[cluster]\nprefix_caching = 'yes'\n", "cluster.prefix_caching", "Expected `bool`"),
        ("[workload]\nrequests = 1.5\n", "workload.requests", "Expected `int`"),
        ("[cluster.scheduler]\nbalancer = 'random'\n", "cluster.scheduler.balancer", "Invalid enum"),
        ("seed = 'x'\n", "seed", "Expected `int`"),
        ("colour = 1\n", "colour", "unknown key"),
        ("[cluster]\nmode = 'pd'\ntopology = 'cm384'\nhardware = '910c'\nlink = 'roce'\n",
         "cluster.link", "not a link of topology 'cm384'"),
    ],
)  # fmt: skip
def test_bad_file_names_its_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert (info.value.source, info.value.key) == (path, key)
    assert problem in info.value.problem


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="invalid TOML"):
        load_scenario(_file(tmp_path, "[cluster\n"))
    with pytest.raises(ScenarioError, match="not a built-in scenario"):
        load_scenario("no-such-scenario")
    with pytest.raises(ScenarioError, match="No such file"):
        load_scenario(str(tmp_path / "missing.toml"))


def test_unknown_builtin_trace() -> None:
    with pytest.raises(ScenarioError, match="no built-in trace 'nope'"):
        trace_path("builtin:nope")


@settings(max_examples=40, deadline=None)
@given(
    key=st.sampled_from(["cluster.tes", "cluster.kv_block_tokens", "cluster.scheduler.max_running",
                         "workload.requests", "seed"]),
    value=st.integers(-5, 5000),
)  # fmt: skip
def test_set_is_validated_exactly_like_the_file(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: int
) -> None:
    """`--set K=V` and a file holding K = V give the same scenario, or the same error."""
    *tables, leaf = key.split(".")
    text = (f"[{'.'.join(tables)}]\n" if tables else "") + f"{leaf} = {value}\n"
    path = str(tmp_path_factory.mktemp("s") / "s.toml")
    Path(path).write_text(text)
    empty = str(tmp_path_factory.mktemp("e") / "e.toml")
    Path(empty).write_text("")

    def outcome(spec: str, overrides: list[str]) -> object:
        try:
            return load_scenario(spec, overrides)
        except ScenarioError as exc:
            return (exc.key, exc.problem)

    assert outcome(path, []) == outcome(empty, [f"{key}={value}"])
