"""Issue 10 acceptance: a TE with 4 DP groups — balance quality (max/mean KV usage across the
groups, sampled through the run) with the TE shell's balancer vs round-robin; the balancer wins."""

from __future__ import annotations

from typing import Any

from scenario_util import masters, run, scenario, show

from deepserve.actors.flowserve import rtc
from deepserve.cluster import run as run_mod

N = 300


def balance(balancer: str) -> tuple[float, dict[str, Any], dict[str, int]]:
    """Mean over samples of max/mean KV blocks in use across the DP groups (1.0 = perfect)."""
    ratios: list[float] = []

    def probe(driver: Any) -> None:
        used = [rtc.hbm_used_blocks(m.state.rtc) for m in masters(driver).values()]
        assert len(used) == 4
        mean = sum(used) / len(used)
        if mean > 0:
            ratios.append(max(used) / mean)

    s = scenario("mooncake-16te", "cluster.tes=1", "cluster.dp_groups=4",
                 f"cluster.scheduler.balancer={balancer}")  # fmt: skip
    result, leaks = run(s, N, on_window=probe)
    assert len(ratios) > N // 4  # sampled at (almost) every window of 2 arrivals
    return sum(ratios) / len(ratios), result.summary, leaks


def test_te_shell_balancer_beats_round_robin(monkeypatch: Any) -> None:
    monkeypatch.setattr(run_mod, "WINDOW_REQUESTS", 2)  # a load sample every 2 arrivals
    smart, a, leaks_a = balance("collaborative")
    rr, b, leaks_b = balance("round_robin")
    show("collaborative:", a)
    show("round robin:  ", b)
    print(f"balance (max/mean KV usage across 4 DP groups): balancer {smart:.3f}, round-robin {rr:.3f}")
    assert a["completed"] == b["completed"] == N and leaks_a == leaks_b == {}
    assert 1.0 <= smart < rr
