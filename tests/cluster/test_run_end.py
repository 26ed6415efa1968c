"""A simulated run ends at the instant its last request becomes terminal (cluster/run.py `drain`):
the timers that never run out (heartbeats, load reports) are not run on past it, so the run's
virtual time is the last request's end, not a count of deliveries (issue 31 §5). The dispatcher
variant (`run_scenario`) ends the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deepserve.cluster.config import load
from deepserve.cluster.run import run_scenario
from deepserve.cluster.sim import control_plane_busy, dispatcher_scenario, run


def _last_end(cfg: Any, runner: Any, **kw: Any) -> tuple[Any, float]:
    ends: list[float] = []
    res = runner(cfg, on_done=lambda d: ends.append(d.finish_s), **kw)
    return res, max(ends)


def test_the_platform_run_ends_with_its_last_request() -> None:
    cfg = load("mooncake-16te", ["cluster.tes=2"], "sim")
    res, last = _last_end(cfg, run, requests=40)
    assert res.workload["completed"] == 40
    assert res.virtual_time_s == last  # heartbeats (a lease a minute) would have run on


def test_the_dispatcher_run_ends_with_its_last_request() -> None:
    cfg = load("mooncake-16te", ["cluster.tes=2"], "sim")
    res, last = _last_end(dispatcher_scenario(cfg), run_scenario, requests=40)
    assert res.injected == 40
    assert res.virtual_time_s == last



def test_a_run_whose_control_plane_is_still_at_work_ends_when_it_is_done(tmp_path: Any) -> None:
    """te/1's pod is killed at 35 s: the monitor declares it and the manager replaces it through
    the cold path, while te/0 finishes the last request (39.7 s). The run goes on until the
    replacement is ready (cluster/sim.py `control_plane_busy`), not a delivery more."""
    base = (Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "mooncake-16te.toml").read_text()
    path = tmp_path / "kill.toml"
    path.write_text(base + '\n[[faults]]\nat_s = 35.0\nkind = "kill-te"\ntarget = "te/1"\n')
    cfg = load(str(path), ["cluster.tes=2"], "sim")
    seen: list[Any] = []
    res, last = _last_end(cfg, run, requests=20, on_end=lambda d: seen.append(control_plane_busy(d)))
    assert res.summary["completed"] == 20
    assert res.summary["tes_ready_at_end"] == res.summary["tes_target"] == 2
    assert res.virtual_time_s > last + 1.0 and seen == [False]
