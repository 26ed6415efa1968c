"""Issue 10 acceptance: prefix caching on the Mooncake conversation trace (its hash_ids say which
512-token blocks requests share): the hit rate is reported, and mean TTFT is lower with caching."""

from __future__ import annotations

from scenario_util import run, scenario, show

from deepserve.adapters.scenario.loader import trace_path
from deepserve.adapters.traces import open_trace
from deepserve.adapters.traces.prompts import prompt_of

N = 500
# One TE (every turn of a conversation meets its earlier turns' KV), arrivals stretched 10x so
# the TE is not saturated, and a DRAM tier so reuse far apart in time still finds the KV.
SETTINGS = ("cluster.tes=1", "workload.rps_scale=0.1", "cluster.kv_dram_gb=512")


def ideal_hit_rate(n: int, block: int) -> float:
    """The most any cache can hit on the first n requests: an infinite cache, one node."""
    seen: set[int] = set()
    hit = total = 0
    for req in open_trace(trace_path("builtin:mooncake_conv_1k")).head(n):
        hashes = prompt_of(req, block).block_hashes
        k = 0
        while k < len(hashes) and hashes[k] in seen:
            k += 1
        hit, total = hit + k * block, total + req.prompt_tokens
        seen.update(hashes)
    return hit / total


def test_prefix_caching_lowers_mean_ttft_on_the_mooncake_slice() -> None:
    on, leaks_on = run(scenario("mooncake-16te", *SETTINGS, "cluster.prefix_caching=true"), N)
    off, leaks_off = run(scenario("mooncake-16te", *SETTINGS, "cluster.prefix_caching=false"), N)
    a, b = on.summary, off.summary
    show("prefix caching on: ", a)
    show("prefix caching off:", b)
    ideal = ideal_hit_rate(N, 512)
    print(f"hit rate {a['prefix_hit_rate']:.3f} (an infinite cache: {ideal:.3f}); mean TTFT "
          f"{a['ttft_ms_mean']:.0f} ms with caching vs {b['ttft_ms_mean']:.0f} ms without")  # fmt: skip
    assert a["completed"] == b["completed"] == N and leaks_on == leaks_off == {}
    assert b["prefix_hit_rate"] == 0.0
    assert 0.5 * ideal < a["prefix_hit_rate"] <= ideal
    assert a["ttft_ms_mean"] < b["ttft_ms_mean"]
