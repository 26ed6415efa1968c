"""NPU timer lateness (issue 30 §4): how late the daemon's event loop fired an emulated forward
pass's end, as `AsyncDriver.timer_late` measures it, exported as
`deepserve_npu_timer_lateness_seconds` (metrics.py registers the collector) so that a user can tell
emulation error from platform overhead."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily

from deepserve.adapters.hardware.devices.npu import GRAPH_KEY

# An emulated forward pass's end fired late by the event loop: from sub-ms (quiet) to 100s of ms
LATENESS_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Lateness:
    """NPU timer lateness as the driver measures it (`AsyncDriver.timer_late`): counts per bucket,
    and their sum — a list index and two additions per forward pass, and plain numbers a TE
    process ships to the main one in its status file (processes mode: the NPUs run there)."""

    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENESS_BUCKETS) + 1)  # the last: over the largest bucket
        self.sum_s = 0.0

    def observe(self, key: str, late_s: float) -> None:
        """A timer fired `late_s` after its deadline: an NPU's forward-pass end counts (a float a
        hair early is on time)."""
        if key != GRAPH_KEY:
            return
        late = late_s if late_s > 0.0 else 0.0
        self.counts[bisect_left(LATENESS_BUCKETS, late)] += 1
        self.sum_s += late

    def snapshot(self) -> dict[str, Any]:
        return {"counts": list(self.counts), "sum_s": self.sum_s}


class LatenessCollector:
    """`deepserve_npu_timer_lateness_seconds`: this process's NPUs' lateness, plus each TE
    process's as its status file last said (a process gone keeps its counts: never backwards)."""

    def __init__(self, local: Lateness) -> None:
        self.local = local
        self.remote: dict[str, dict[str, Any]] = {}  # live pod -> its last snapshot
        self.retired = Lateness()  # the pods gone since, added up

    def update(self, pods: set[str], snapshots: dict[str, dict[str, Any]]) -> None:
        """`pods`: the TE processes status shows now; `snapshots`: those whose file was read."""
        for pod in [p for p in self.remote if p not in pods]:
            self._add(self.retired, self.remote.pop(pod))
        self.remote.update(snapshots)

    @staticmethod
    def _add(into: Lateness, snap: dict[str, Any]) -> None:
        for i, n in enumerate(snap.get("counts", ())[: len(into.counts)]):
            into.counts[i] += int(n)
        into.sum_s += float(snap.get("sum_s", 0.0))

    def collect(self) -> Iterator[HistogramMetricFamily]:
        total = Lateness()
        for part in (self.local.snapshot(), self.retired.snapshot(), *self.remote.values()):
            self._add(total, part)
        cumulative, buckets = 0, []
        for le, n in zip((*(f"{b:g}" for b in LATENESS_BUCKETS), "+Inf"), total.counts, strict=True):
            cumulative += n
            buckets.append((le, cumulative))
        yield HistogramMetricFamily(
            "deepserve_npu_timer_lateness_seconds",
            "How late the event loop fired an emulated forward pass's end (fire wall time - the "
            "model's end time): platform overhead, not emulation", buckets=buckets, sum_value=total.sum_s)
