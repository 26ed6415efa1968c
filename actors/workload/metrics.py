"""SLO metrics of a run, from its requests' terminal records — pure functions.

TTFT = first token − arrival; TPOT = (finish − first token) / (output tokens − 1), for requests
with at least two output tokens (vLLM's benchmark definitions); e2e = finish − arrival. The prefix
hit rate is cached prompt tokens / prompt tokens over completed requests. Percentiles interpolate
linearly between order statistics (numpy's default), so p50 of [1, 2] is 1.5.

The latency percentiles are of completed requests; a failed request's time from arrival to its
failure has keys of its own (`failed_e2e_ms_*`): a request that waited 40 minutes on a hung NPU
before failing must show somewhere, and mixing it into `e2e_ms_*` would change what they meant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec

from .messages import RequestDone

PERCENTILES = (50, 90, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values; NaN when there are none."""
    if not 0 <= q <= 100:
        raise ValueError(f"q: must be in [0, 100], got {q}")
    n = len(sorted_values)
    if n == 0:
        return math.nan
    pos = (n - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class Summary(msgspec.Struct, kw_only=True):
    requests: int
    completed: int
    failed: int
    cancelled: int
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    prefix_hit_rate: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    ttft_ms_p99: float
    tpot_ms_mean: float
    tpot_ms_p50: float
    tpot_ms_p90: float
    tpot_ms_p99: float
    e2e_ms_p50: float
    e2e_ms_p90: float
    e2e_ms_p99: float
    failed_e2e_ms_p50: float  # arrival to failure, failed requests only (NaN: none failed)
    failed_e2e_ms_p90: float
    failed_e2e_ms_p99: float
    failed_e2e_ms_max: float
    duration_s: float  # virtual time from the first arrival to the last finish
    throughput_rps: float  # completed requests per virtual second
    output_tokens_per_s: float
    failure_reasons: dict[str, int]


class Collector:
    """Accumulates terminal records as they come (the run's `ext/metrics` listener)."""

    def __init__(self) -> None:
        self.ttft_ms: list[float] = []
        self.tpot_ms: list[float] = []
        self.e2e_ms: list[float] = []
        self.failed_e2e_ms: list[float] = []
        self.counts = {"completed": 0, "failed": 0, "cancelled": 0}
        self.prompt_tokens = self.cached_prompt_tokens = self.output_tokens = 0
        self.first_arrival_s = math.inf
        self.last_finish_s = -math.inf
        self.failure_reasons: dict[str, int] = {}

    def add(self, d: RequestDone) -> None:
        self.counts[d.status] += 1
        self.first_arrival_s = min(self.first_arrival_s, d.arrival_s)
        self.last_finish_s = max(self.last_finish_s, d.finish_s)
        if d.status != "completed":
            if d.status == "failed":
                self.failed_e2e_ms.append((d.finish_s - d.arrival_s) * 1e3)
            key = d.reason[:120]
            self.failure_reasons[key] = self.failure_reasons.get(key, 0) + 1
            return
        self.prompt_tokens += d.prompt_tokens
        self.cached_prompt_tokens += d.cached_prompt_tokens
        self.output_tokens += d.output_tokens
        self.e2e_ms.append((d.finish_s - d.arrival_s) * 1e3)
        if d.first_token_s is not None:
            self.ttft_ms.append((d.first_token_s - d.arrival_s) * 1e3)
            if d.output_tokens >= 2:
                self.tpot_ms.append((d.finish_s - d.first_token_s) * 1e3 / (d.output_tokens - 1))

    def extend(self, done: Iterable[RequestDone]) -> Collector:
        for d in done:
            self.add(d)
        return self

    @property
    def terminal(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> Summary:
        ttft, tpot, e2e = sorted(self.ttft_ms), sorted(self.tpot_ms), sorted(self.e2e_ms)
        failed = sorted(self.failed_e2e_ms)
        span = max(self.last_finish_s - self.first_arrival_s, 0.0) if self.terminal else 0.0
        done = self.counts["completed"]
        return Summary(
            requests=self.terminal, completed=done, failed=self.counts["failed"],
            cancelled=self.counts["cancelled"], prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens, output_tokens=self.output_tokens,
            prefix_hit_rate=self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            ttft_ms_mean=_mean(ttft), ttft_ms_p50=percentile(ttft, 50),
            ttft_ms_p90=percentile(ttft, 90), ttft_ms_p99=percentile(ttft, 99),
            tpot_ms_mean=_mean(tpot), tpot_ms_p50=percentile(tpot, 50),
            tpot_ms_p90=percentile(tpot, 90), tpot_ms_p99=percentile(tpot, 99),
            e2e_ms_p50=percentile(e2e, 50), e2e_ms_p90=percentile(e2e, 90),
            e2e_ms_p99=percentile(e2e, 99), failed_e2e_ms_p50=percentile(failed, 50),
            failed_e2e_ms_p90=percentile(failed, 90), failed_e2e_ms_p99=percentile(failed, 99),
            failed_e2e_ms_max=failed[-1] if failed else math.nan, duration_s=span,
            throughput_rps=done / span if span > 0 else 0.0,
            output_tokens_per_s=self.output_tokens / span if span > 0 else 0.0,
            failure_reasons=dict(sorted(self.failure_reasons.items())),
        )  # fmt: skip


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan
