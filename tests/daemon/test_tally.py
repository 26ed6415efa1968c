"""The metrics hooks' tallies (daemon/tally.py) scrape exactly as prometheus_client's own
`observe`/`inc` calls would: same buckets, counts and sums (bit for bit), folds at any points."""

from __future__ import annotations

import random
import re

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from deepserve.daemon.metrics import ITL_BUCKETS, TTFT_BUCKETS
from deepserve.daemon.tally import Tallies


def _registry() -> tuple[CollectorRegistry, Histogram, Histogram, Counter]:
    r = CollectorRegistry()
    a = Histogram("a_seconds", "a", ["model_name"], registry=r, buckets=TTFT_BUCKETS)
    b = Histogram("b_tokens", "b", ["model_name", "k"], registry=r, buckets=(1, 8, 16, 64))
    c = Counter("c", "c", ["model_name"], registry=r)
    return r, a, b, c


def _text(r: CollectorRegistry) -> str:
    # the `_created` samples are each child's creation time: not an observation
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", generate_latest(r).decode())


def _values(rng: random.Random, n: int) -> list[float]:
    edges = [*TTFT_BUCKETS, *ITL_BUCKETS, 0.0, 1e9, float("inf"), float("nan")]
    return [rng.choice(edges) if rng.random() < 0.2 else rng.choice((rng.random() * 3, float(rng.randrange(100))))
            for _ in range(n)]  # fmt: skip


def test_tallies_scrape_as_the_childrens_own_calls() -> None:
    rng = random.Random(30)
    ref, ra, rb, rc = _registry()
    got, ga, gb, gc = _registry()
    t = Tallies()
    for round_ in range(20):
        for v in _values(rng, rng.randrange(0, 200)):
            which = rng.randrange(3)
            if which == 0:
                ra.labels("m").observe(v)
                t.hist(ga, "m").observe(v)
            elif which == 1:
                k = rng.choice(("x", "y"))
                rb.labels("m", k).observe(v)
                t.hist(gb, "m", k).observe(v)
            elif v == v and v != float("inf"):
                n = int(v) if round_ % 2 else v
                rc.labels("m").inc(n)
                t.counter(gc, "m").inc(n)
        t.fold()
        assert _text(got) == _text(ref)
    t.fold()  # nothing new: unchanged
    assert _text(got) == _text(ref)


def test_a_series_appears_at_its_first_observation_as_before() -> None:
    got, ga, _gb, _gc = _registry()
    t = Tallies()
    assert "a_seconds_count" not in _text(got)
    t.hist(ga, "m").observe(0.3)
    t.fold()
    assert 'a_seconds_count{model_name="m"} 1.0' in _text(got)


def test_a_negative_count_is_refused_as_by_the_counter() -> None:
    _r, _a, _b, gc = _registry()
    t = Tallies()
    try:
        t.counter(gc, "m").inc(-1)
    except ValueError:
        return
    raise AssertionError("a negative increment was taken")
