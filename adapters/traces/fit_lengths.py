"""Fit the emulated model's output-length law to a trace's output lengths.

    python -m deepserve.adapters.traces.fit_lengths /work/shared/traces/azure_llm_2023_conv.csv

prints the lognormal's maximum-likelihood parameters (mu, sigma: the mean and standard deviation
of ln(output tokens)) as the `[cluster.scheduler]` lines the daemon's config takes, with the
trace's quantiles beside the fitted law's and the Kolmogorov-Smirnov distance, so a reader can
judge the fit. Bad input: exit 2 with one line on stderr.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence

from .common import TraceError
from .reader import open_trace

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def fit_lognormal(lengths: Sequence[int]) -> tuple[float, float]:
    """(mu, sigma) of the maximum-likelihood lognormal of positive lengths."""
    if len(lengths) < 2:
        raise ValueError(f"output lengths: need at least 2, got {len(lengths)}")
    logs = [math.log(x) for x in lengths if x > 0]
    if len(logs) < 2:
        raise ValueError("output lengths: fewer than 2 are positive")
    return statistics.fmean(logs), statistics.pstdev(logs)


def ks_distance(lengths: Sequence[int], mu: float, sigma: float) -> float:
    """The largest gap between the trace's empirical CDF and the fitted lognormal's."""
    law, xs, n = statistics.NormalDist(mu, sigma), sorted(lengths), len(lengths)
    gap = 0.0
    for i, x in enumerate(xs):
        if i + 1 < n and xs[i + 1] == x:
            continue  # ties: the empirical CDF jumps once, after the last of them
        f = law.cdf(math.log(x + 0.5))  # lengths round to integers
        gap = max(gap, abs((i + 1) / n - f))
    return gap


def report(path: str) -> str:
    lengths = [r.output_tokens for r in open_trace(path)]
    mu, sigma = fit_lognormal(lengths)
    xs, law = sorted(lengths), statistics.NormalDist(mu, sigma)
    rows = [f"# {q:>4}: trace {xs[min(len(xs) - 1, int(q * len(xs)))]:>5}, fit {math.exp(law.inv_cdf(q)):7.1f}"
            for q in QUANTILES]  # fmt: skip
    return "\n".join([
        f"# lognormal fitted to the output lengths of {len(lengths)} requests of {path}",
        f"# Kolmogorov-Smirnov distance {ks_distance(lengths, mu, sigma):.3f}; quantiles:",
        *rows,
        'eos_model = "lognormal"',
        f"eos_lognormal_mu = {mu:.4f}",
        f"eos_lognormal_sigma = {sigma:.4f}",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m deepserve.adapters.traces.fit_lengths TRACE", file=sys.stderr)
        return 2
    try:
        print(report(args[0]))
    except (TraceError, ValueError) as exc:
        print(f"fit_lengths: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
