"""The package's layering (DESIGN.md, Layout): the arrows only point down the table.

The rule is import-linter's layers contract in pyproject.toml (`lint-imports` runs it too). These
tests run it on the real import graph, check that the graph holds every module of the package
(a directory without `__init__.py` would hide its imports from it), and plant arrows in a copy of
the graph to show that each line of the table is enforced, and that the arrows it allows pass.
"""

from __future__ import annotations

import ast
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest
from importlinter.api import read_configuration
from importlinter.contracts.layers import LayersContract

import deepserve

ROOT = Path(deepserve.__file__).resolve().parent
PYPROJECT = ROOT / "pyproject.toml"
# Not modules of the package (setup.py builds it; the rest is what a checkout holds or makes).
NOT_PACKAGE = {"tests", "build", "runs", "docs", "dist"}


def _contract() -> LayersContract:
    config = read_configuration(str(PYPROJECT))
    (options,) = [c for c in config["contracts_options"] if c["id"] == "layers"]
    return LayersContract(name=options["name"], session_options=config["session_options"],
                          contract_options=options)  # fmt: skip


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("deepserve", cache_dir=None)


def _broken(contract: LayersContract, graph: grimp.ImportGraph) -> str:
    """The contract's report on the graph, or "" when it is kept."""
    check = contract.check(graph, verbose=False)
    if check.kept:
        return ""
    lines = []
    for dep in check.metadata.get("invalid_dependencies", []):
        lines.append(f"{dep['importer']} -> {dep['imported']}:")
        for route in dep["routes"]:
            chain = route["chain"] or route["extra_firsts"]
            for link in chain:
                at = ", ".join(map(str, link["line_numbers"]))
                lines.append(f"    {link['importer']} -> {link['imported']} (line {at})")
    return "\n".join(lines) or repr(check.metadata)


def test_the_package_keeps_the_layering(graph: grimp.ImportGraph) -> None:
    report = _broken(_contract(), graph)
    assert report == "", f"imports up DESIGN.md's Layout table:\n{report}"


def test_the_graph_holds_every_module(graph: grimp.ImportGraph) -> None:
    files = set()
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith((".", "__")) and d not in NOT_PACKAGE]
        rel = Path(folder).relative_to(ROOT)
        for name in names:
            if name.endswith(".py") and rel.parts + (name,) != ("setup.py",):
                parts = [p for p in (*rel.parts, name.removesuffix(".py")) if p != "__init__"]
                files.add(".".join(["deepserve", *parts]))
    assert files - graph.modules == set()


# (importer, imported): one arrow up the table for each of its rules, and one a new top-level
# package makes before it has a layer.
FORBIDDEN = [
    ("core.actor", "actors.gateway.actor"),  # core never imports actors
    ("core.sim", "persistence.api"),  # ... nor the store
    ("actors.je.actor", "adapters.hardware.devices.npu"),  # an actor never imports an adapter
    ("actors.je.actor", "persistence.api"),  # actors: core only
    ("persistence.api", "actors.je.messages"),  # persistence: core only
    ("adapters.traces.reader", "replay.why"),  # adapters: below replay
    ("replay.verify_logs", "daemon.procs.supervisor"),  # replay never imports the daemon
    ("replay.why", "cli.util"),  # nothing imports cli/
    ("daemon.server", "cli.main"),
    ("benchmarks.sim", "cli.util"),
    ("cluster.assembly", "daemon.runtime"),  # the one assembly sits below the daemon
    ("cluster.assembly", "benchmarks.sim"),  # ... and the benchmarks
    ("replay.why", "cluster.assembly"),  # ... and above replay
    ("adapters.scenario.faults", "cluster.assembly"),  # a config's data sits below its wiring
    ("adapters.scenario.partition", "cluster.parallel"),
    ("platform.build", "daemon.runtime"),  # (its other name)
    ("cmdline", "core.actor"),  # the shared command-line pieces sit below everything
    ("newpkg.thing", "core.actor"),  # a top-level package in no layer
]
ALLOWED = [
    ("cli.daemon", "daemon.config"),
    ("benchmarks.http", "daemon.config"),
    ("daemon.runtime", "cluster.assembly"),
    ("cli.sim", "cluster.sim"),
    ("cluster.assembly", "replay.why"),
    ("cluster.config", "adapters.scenario.loader"),
    ("platform.build", "actors.je.actor"),
    ("chaos.run", "cluster.sim"),
    ("replay.why", "adapters.traces.reader"),
    ("cluster.run", "actors.je.actor"),
    ("cluster.run", "persistence.api"),
    ("cluster.parallel", "adapters.scenario.partition"),
    ("replay.verify_logs", "adapters.scenario.partition"),
    ("actors.je.actor", "core.actor"),
    ("persistence.api", "core.records"),
    ("adapters.scenario.cli", "cmdline"),
]


@contextlib.contextmanager
def _with_arrow(graph: grimp.ImportGraph, importer: str, imported: str) -> Iterator[grimp.ImportGraph]:
    """The graph with one more import (and the modules it names), as it was again afterwards."""
    named = (f"deepserve.{importer}", f"deepserve.{imported}")
    # each module with the packages above it (a layer is a top-level package), parents first
    chains = (".".join(m.split(".")[:i]) for m in named for i in range(2, m.count(".") + 2))
    new = [m for m in dict.fromkeys(chains) if m not in graph.modules]
    for module in new:
        graph.add_module(module)
    graph.add_import(importer=f"deepserve.{importer}", imported=f"deepserve.{imported}", line_number=1,
                     line_contents=f"import deepserve.{imported}")  # fmt: skip
    try:
        yield graph
    finally:
        graph.remove_import(importer=f"deepserve.{importer}", imported=f"deepserve.{imported}")
        for module in reversed(new):
            graph.remove_module(module)


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN)
def test_an_arrow_up_the_table_breaks_it(graph: grimp.ImportGraph, importer: str, imported: str) -> None:
    with _with_arrow(graph, importer, imported) as planted:
        assert _broken(_contract(), planted) != ""
    assert _broken(_contract(), graph) == ""  # the real graph again


@pytest.mark.parametrize(("importer", "imported"), ALLOWED)
def test_an_arrow_down_the_table_keeps_it(graph: grimp.ImportGraph, importer: str, imported: str) -> None:
    with _with_arrow(graph, importer, imported) as planted:
        assert _broken(_contract(), planted) == ""


def test_adapters_scenario_is_data_only() -> None:
    """One place assembles a cluster (issue 31 §6): the scenario package holds a config's data,
    checks and pure plans; nothing in it spawns an actor or injects an input into a driver (the
    wiring is deepserve/cluster/)."""
    wiring = []
    for path in sorted((ROOT / "adapters" / "scenario").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("spawn", "inject"):
                wiring.append(f"{path.name}:{node.lineno} .{node.func.attr}(...)")
    assert wiring == []
