"""`deepserve sim` simulates with the cyclic GC's first threshold raised (SIM_GC_GEN0_THRESHOLD:
at the command's 10,000 the collector re-walked the run's survivors for 0.9 s of ~13 s CPU on the
whole Mooncake trace) and puts the command's threshold back after, without a collection of
everything the run left (the survivors move to the oldest generation)."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
from cliproc import in_process

import deepserve.cli.sim_scenario as sim_scenario
from deepserve.cli.main import GC_GEN0_THRESHOLD


def test_sim_runs_with_the_raised_threshold_and_restores_it(monkeypatch: Any, tmp_path: Path) -> None:
    seen: list[tuple[int, int, int]] = []
    inner = sim_scenario._run

    def spy(*args: Any) -> Any:
        seen.append(gc.get_threshold())
        return inner(*args)

    monkeypatch.setattr(sim_scenario, "_run", spy)
    after: list[tuple[int, int, int]] = []
    report = sim_scenario.report

    def spy_report(*args: Any, **kw: Any) -> Any:  # called once the run's `finally` ran
        after.append(gc.get_threshold())
        return report(*args, **kw)

    monkeypatch.setattr(sim_scenario, "report", spy_report)
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and seen and not after:  # from the run's start to its report
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        res = in_process("sim", "mooncake-16te", "--requests", "20", "--set", "cluster.tes=2", "--log", "none",
                         "--json", cwd=tmp_path)  # fmt: skip
    finally:
        gc.callbacks.remove(count)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["completed"] == 20
    assert seen and seen[0][0] == sim_scenario.SIM_GC_GEN0_THRESHOLD
    assert after[0][0] == GC_GEN0_THRESHOLD  # the command's own, back
    assert collections == [], collections  # none during the short run, none when restoring


@pytest.fixture(autouse=True)
def _no_frozen_leftovers() -> Any:
    yield
    assert gc.get_freeze_count() == 0  # the run's objects were unfrozen (collectable again)


FREEZE_COUNT = ("import atexit, gc, sys; atexit.register(lambda: print('frozen', gc.get_freeze_count(), file=sys.stderr)); "
                "from deepserve.cli.main import main; ")  # fmt: skip


@pytest.mark.parametrize("call, frozen", [("main()", True), ("main(sys.argv[1:])", False)])
def test_the_program_leaves_what_it_built_to_the_os(tmp_path: Path, call: str, frozen: bool) -> None:
    """Run as the program (argv from the command line), `main` freezes the GC at the end: the
    interpreter's last collection at exit would walk and free the whole simulation (~0.2 s after
    4,000 Mooncake requests). A caller that passes argv (a test, an embedding program) lives on:
    nothing is frozen for it."""
    import subprocess
    import sys

    code = FREEZE_COUNT + f"sys.argv[0] = 'deepserve'; raise SystemExit({call})"
    res = subprocess.run([sys.executable, "-c", code, "sim", "mooncake-16te", "--requests", "5", "--log", "none",
                          "--json"], cwd=tmp_path, capture_output=True, text=True, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["completed"] == 5
    count = int(res.stderr.split("frozen ")[-1])
    assert (count > 0) is frozen, res.stderr[-500:]
