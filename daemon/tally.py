"""Cheap observations for the daemon's hot prometheus series (issue 30 §1, CPU per request).

prometheus_client's `Histogram.observe` and `Counter.inc` take a lock per call (and observe
walks the buckets in Python): four to six calls a streamed chunk and ~15 a finished request
were ~6 % of the daemon's event-loop CPU under `bench http`'s load (py-spy). The frontend's hooks
all run on the event loop's thread, so a `Tally` keeps a series' observations since the last
scrape as plain numbers — a count per bucket, the running sum — and `fold` adds them into the
prometheus_client child at scrape time: one `inc` a bucket that moved, one `set` of the sum. The
exposition is what the child's own `observe`/`inc` calls would have given, sums included bit for
bit (the running sum adds the same values in the same order from the same 0.0):
tests/daemon/test_tally.py feeds both the same observations and compares the scraped text.

The readable version is the child's own method (`child.observe(v)`, `child.inc(n)`); a tally
is created beside the child it folds into, at the moment the child would have been (the first
observation of the series), so the series appear at the same time too.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any


class Tally:
    """A histogram child's observations since the last fold: `observe` is the child's."""

    __slots__ = ("bounds", "child", "counts", "moved", "sum")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds: list[float] = list(child._upper_bounds)  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.sum: float = child._sum.get()  # the running sum, set on the child at each fold
        self.moved = False

    def observe(self, v: float) -> None:
        """prometheus_client's rule: the first bucket whose bound is >= v (NaN: none), sum += v."""
        self.sum += v
        self.moved = True
        if v == v:
            self.counts[bisect_left(self.bounds, v)] += 1

    def fold(self) -> None:
        if not self.moved:
            return
        child, counts = self.child, self.counts
        for i, n in enumerate(counts):
            if n:
                child._buckets[i].inc(n)
                counts[i] = 0
        child._sum.set(self.sum)
        self.moved = False


class CountTally:
    """A counter child's increments since the last fold (its running total, set at each fold)."""

    __slots__ = ("child", "moved", "total")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.total: float = child._value.get()
        self.moved = False

    def inc(self, n: float = 1) -> None:
        if n < 0:  # as prometheus_client's Counter.inc
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.total += n
        self.moved = True

    def fold(self) -> None:
        if self.moved:
            self.child._value.set(self.total)
            self.moved = False


class Tallies:
    """The tallies of one registry's series, made on first use (with the child), folded together."""

    def __init__(self) -> None:
        self._of: dict[tuple[int, tuple[str, ...]], Tally | CountTally] = {}

    def hist(self, metric: Any, *labels: str) -> Tally:
        key = (id(metric), labels)
        t = self._of.get(key)
        if t is None:
            t = self._of[key] = Tally(metric.labels(*labels))
        return t  # type: ignore[return-value]

    def counter(self, metric: Any, *labels: str) -> CountTally:
        key = (id(metric), labels)
        t = self._of.get(key)
        if t is None:
            t = self._of[key] = CountTally(metric.labels(*labels))
        return t  # type: ignore[return-value]

    def fold(self) -> None:
        """Before a scrape: every series' observations into its prometheus_client child."""
        for t in self._of.values():
            t.fold()
