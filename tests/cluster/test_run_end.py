"""A simulated run ends at the instant its last request becomes terminal (cluster/run.py `drain`):
the timers that never run out (heartbeats, load reports) are not run on past it, so the run's
virtual time is the last request's end, not a count of deliveries (issue 31 §5). The dispatcher
variant (`run_scenario`) ends the same way."""

from __future__ import annotations

from typing import Any

from deepserve.cluster.config import load
from deepserve.cluster.run import run_scenario
from deepserve.cluster.sim import dispatcher_scenario, run


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

