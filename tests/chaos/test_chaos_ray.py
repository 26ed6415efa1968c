"""`deepserve chaos --cluster local`: the seeds as tasks of a Ray instance started on this machine
give the same results as this process (a seed is a function of the command line alone)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import in_process

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'deepserve[ray]')")

from deepserve.chaos.platform import load_config  # noqa: E402
from deepserve.chaos.pool import run_seeds  # noqa: E402
from deepserve.chaos.report import summary  # noqa: E402


def test_seeds_on_a_local_ray_instance_match_this_process(tmp_path: Path) -> None:
    res = in_process("chaos", "mooncake-16te", "--set", "cluster.tes=3", "--seeds", "2", "--first-seed", "11",
                     "--requests", "12", "--cluster", "local", "--json", "--log-dir", str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    on_ray = json.loads(res.stdout.strip().splitlines()[-1])
    assert on_ray["backend"] == "ray local" and on_ray["seeds_per_hour"] > 0
    scenario = load_config("mooncake-16te", ["cluster.tes=3"])
    results, wall = run_seeds(scenario, [11, 12], 12, str(tmp_path), workers=1)
    here = summary(results, wall, "this process")
    keys = ("seeds", "requests", "completed", "failed", "faults_injected", "violations", "steps")
    assert {k: on_ray[k] for k in keys} == {k: here[k] for k in keys}
    assert on_ray["violations"] == 0 and on_ray["requests"] == 24
    assert not ray.is_initialized()  # the instance it started is shut down
