"""The simulation fast path end to end: a scenario run with aggregated decode runs gives every
request the timings of the same run stepping every iteration (issue 10, speed section).

With the NPUs' per-forward variance on, the two paths draw their variance factors from different
deliveries' random streams, so the timelines differ (both deterministic and replayable); the
comparison is therefore made at the performance model's mean (`cluster.npu_variance=false`)."""

from __future__ import annotations

from typing import Any

import pytest
from scenario_util import run, scenario

TOLERANCE_S = 1e-9  # float rounding of the two sums (observed: ~4e-15 s)


def _records(aggregate: bool, trace: str) -> tuple[dict[str, Any], int]:
    done: list[Any] = []
    s = scenario("mooncake-16te", "cluster.tes=2", "cluster.npu_variance=false", f"workload.trace={trace}",
                 f"cluster.scheduler.aggregate={str(aggregate).lower()}")  # fmt: skip
    result, leaks = run(s, 40, on_done=done.append)
    assert leaks == {} and result.summary["completed"] == 40
    return {d.request_id: d for d in done}, result.deliveries


@pytest.mark.parametrize("trace", ["builtin:mooncake_conv_1k", "builtin:azure_conv_500"])
def test_aggregated_and_stepwise_give_the_same_request_timings(trace: str) -> None:
    fast, fast_deliveries = _records(True, trace)
    slow, slow_deliveries = _records(False, trace)
    assert fast.keys() == slow.keys()
    worst = 0.0
    for rid, d in fast.items():
        s = slow[rid]
        assert (d.output_tokens, d.cached_prompt_tokens) == (s.output_tokens, s.cached_prompt_tokens)
        for a, b in ((d.first_token_s, s.first_token_s), (d.finish_s, s.finish_s)):
            assert a is not None and b is not None
            worst = max(worst, abs(a - b))
    print(f"{trace}: deliveries aggregated {fast_deliveries}, stepwise {slow_deliveries}; "
          f"largest timing difference {worst:.3g} s")  # fmt: skip
    assert worst <= TOLERANCE_S
    assert fast_deliveries * 3 < slow_deliveries
