"""Issue 10 acceptance: a colocated TE serves 500 requests of the Azure conversation trace."""

from __future__ import annotations

import math

from scenario_util import run, scenario, show


def test_colocated_te_serves_500_azure_requests() -> None:
    s = scenario("mooncake-16te", "cluster.tes=1", "cluster.kv_block_tokens=128",
                 "workload.trace=builtin:azure_conv_500")  # fmt: skip
    result, leaks = run(s, 500)
    m = result.summary
    show("colocated 1 TE, 500 Azure conversation requests:", m)
    assert result.injected == 500
    assert (m["requests"], m["completed"], m["failed"], m["cancelled"]) == (500, 500, 0, 0)
    assert result.workload["duplicates"] == 0
    assert leaks == {}, f"blocks leaked: {leaks}"
    for key in ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99"):
        assert math.isfinite(m[key]) and m[key] > 0, key
    assert m["ttft_ms_p50"] <= m["ttft_ms_p99"] and m["tpot_ms_p50"] <= m["tpot_ms_p99"]
    # A Llama-3-8B decode step on one 910B reads ~16 GB of weights at 1.6 TB/s: >= ~10 ms a token.
    assert 5.0 < m["tpot_ms_p50"] < 200.0
    assert m["prefix_hit_rate"] == 0.0  # Azure prompts share nothing
