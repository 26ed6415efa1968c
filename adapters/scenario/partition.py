"""How `deepserve sim --workers N` splits a colocated cluster (a pure plan: deepserve/cluster/
parallel.py runs it): the servers grouped into partitions, the requests each partition's TEs get,
and the log file each worker writes in the run directory (which `deepserve replay verify DIR`
reads, so the names live below replay).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import msgspec

from .placement import place
from .schema import Scenario


class ParallelError(ValueError):
    """A scenario that cannot be split as asked (the message names why)."""


class Partition(msgspec.Struct, frozen=True):
    index: int
    of: int
    servers: tuple[int, ...]
    tes: tuple[str, ...]  # the TEs on those servers, in placement order


def plan_partitions(scenario: Scenario, workers: int) -> list[Partition]:
    """The servers grouped into at most `workers` contiguous groups of about equal TE counts (a
    pure function; one group when the cluster has one server or `workers` is 1)."""
    if workers < 1:
        raise ParallelError(f"--workers: must be >= 1, got {workers}")
    c = scenario.cluster
    if workers > 1 and c.mode != "colocated":
        raise ParallelError("--workers: a pd scenario's KV crosses servers (prefill -> decode); "
                            "run it with --workers 1")  # fmt: skip
    if workers > 1 and scenario.scheduling is not None:
        raise ParallelError("--workers: the [scheduling] section's JE routes by every TE's load; "
                            "run it with --workers 1")  # fmt: skip
    placement = place(c)
    used = sorted({t.server for t in placement.tes})
    k = min(workers, len(used))
    target = len(placement.tes) / k
    # Each server joins the group its TEs' midpoint falls in (contiguous, about equal TE counts).
    groups: dict[int, list[int]] = {}
    taken = 0
    for s in used:
        on_s = sum(t.server == s for t in placement.tes)
        g = min(k - 1, int((taken + on_s / 2) / target))
        groups.setdefault(g, []).append(s)
        taken += on_s
    assert sum(len(g) for g in groups.values()) == len(used) and len(groups) <= k
    ordered = [groups[g] for g in sorted(groups)]
    return [
        Partition(i, len(ordered), tuple(g), tuple(t.addr for t in placement.tes if t.server in g))
        for i, g in enumerate(ordered)
    ]


def selector(scenario: Scenario, part: Partition) -> Callable[[int], bool]:
    """Which requests (by 0-based position in the trace) the partition's TEs get from the whole
    run's workload actor: position k goes to the k-th TE round-robin (colocated mode)."""
    tes = place(scenario.cluster).role("colocated")
    mine = [te in part.tes for te in tes]
    n = len(tes)
    return lambda k: mine[k % n]


def worker_log_names(parts: list[Partition]) -> list[str]:
    """The log file of each partition inside the run directory."""
    return [worker_log_name(p.index) for p in parts]


def worker_log_name(index: int) -> str:
    return f"w{index}.db"


def is_worker_log(name: str) -> bool:
    """Whether a file name in a run directory is a worker's log (`worker_log_names`)."""
    return re.fullmatch(r"w\d+\.db", name) is not None
