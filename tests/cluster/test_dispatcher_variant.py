"""`scheduling.entry = "dispatcher"` is a variant of the one assembly, reached through the same
entry as the platform (`deepserve.cluster.sim.run`, which `deepserve sim` calls for both): the
scenario's TEs behind the workload stand-in (assembly.py `build_cluster`), no gateway, JE nor
control plane — the very run, log for log, that the dispatcher harness made."""

from __future__ import annotations

import msgspec

from deepserve.cluster.config import load
from deepserve.cluster.run import run_scenario
from deepserve.cluster.sim import dispatcher_scenario, run
from deepserve.persistence.memory import MemorySink

OVERRIDES = ("cluster.tes=4", 'scheduling.entry="dispatcher"')


def _log(sink: MemorySink) -> list[bytes]:
    return [msgspec.msgpack.encode(step) for step in sink.steps]


def test_the_dispatcher_entry_runs_the_tes_behind_the_workload_stand_in() -> None:
    cfg = load("mooncake-16te", OVERRIDES)
    sink = MemorySink()
    out = run(cfg, requests=40, sink=sink).summary
    actors = {step.input.actor for step in sink.steps}
    assert "workload" in actors and not actors & {"gateway", "je/0", "cluster", "pods"}, sorted(actors)
    assert out["completed"] == 40 and "tes_target" not in out  # no control plane to report on
    again = MemorySink()
    run_scenario(dispatcher_scenario(cfg), requests=40, sink=again)
    assert _log(sink) == _log(again)  # the harness's own run, step for step
