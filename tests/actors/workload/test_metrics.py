"""SLO metrics: percentiles, TTFT/TPOT/e2e definitions, hit rate."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepserve.actors.workload.messages import RequestDone
from deepserve.actors.workload.metrics import Collector, percentile


@given(st.lists(st.floats(-1e6, 1e6), min_size=2, max_size=200), st.integers(1, 99))
def test_percentile_matches_the_inclusive_quantile(values: list[float], q: int) -> None:
    expect = statistics.quantiles(values, n=100, method="inclusive")[q - 1]
    assert percentile(sorted(values), q) == pytest.approx(expect, rel=1e-9, abs=1e-6)


def test_percentile_edges() -> None:
    assert math.isnan(percentile([], 50))
    assert percentile([3.0], 99) == 3.0 and percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(ValueError, match="q: must be in"):
        percentile([1.0], 101)


def _done(i: int, status: str = "completed", out: int = 5) -> RequestDone:
    return RequestDone(
        request_id=f"r{i}", status=status, reason="target" if status == "completed" else "boom",
        arrival_s=float(i), first_token_s=i + 0.1 * (i + 1), finish_s=i + 0.1 * (i + 1) + 0.02 * (out - 1),
        prompt_tokens=1000, cached_prompt_tokens=250 * i, output_tokens=out, te="te/0",
    )  # fmt: skip


def test_summary_definitions() -> None:
    s = Collector().extend([_done(0), _done(1), _done(2), _done(3, "failed"), _done(4, out=1)]).summary()
    assert (s.requests, s.completed, s.failed) == (5, 4, 1)
    assert s.ttft_ms_p50 == pytest.approx(250.0)  # 100, 200, 300, 500 ms
    assert s.tpot_ms_p50 == pytest.approx(20.0) and s.tpot_ms_p99 == pytest.approx(20.0)
    assert s.prefix_hit_rate == pytest.approx((0 + 250 + 500 + 1000) / 4000)
    assert s.failure_reasons == {"boom": 1}
    assert s.duration_s == pytest.approx(4.5) and s.throughput_rps == pytest.approx(4 / 4.5)
