"""Max-min fair sharing of link bandwidth among concurrent flows (progressive filling).

Pure functions: given link capacities and each flow's path, return each flow's rate; and, given
flow sizes and start times, when each flow completes as flows come and go. Used for PCIe shared
by a server's NPUs, KV transfers sharing RoCE, and anything else the emulator runs concurrently.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from msgspec import Struct

# Relative slack when deciding a link is saturated: rates are floats summed over many rounds.
_SATURATION_RTOL = 1e-9


class Flow(Struct, frozen=True, kw_only=True):
    path: tuple[str, ...]
    nbytes: float
    start_s: float = 0.0


def _validate(capacities: Mapping[str, float], flows: Mapping[str, Sequence[str]]) -> None:
    for link, cap in capacities.items():
        if not cap > 0:
            raise ValueError(f"capacities: link {link!r} must have capacity > 0, got {cap}")
    for flow, path in flows.items():
        if not path:
            raise ValueError(f"flows: flow {flow!r} has an empty path")
        if len(set(path)) != len(path):
            raise ValueError(f"flows: flow {flow!r} crosses a link twice: {list(path)}")
        for link in path:
            if link not in capacities:
                raise ValueError(f"flows: flow {flow!r} uses unknown link {link!r}")


def max_min_rates(
    capacities: Mapping[str, float], flows: Mapping[str, Sequence[str]]
) -> dict[str, float]:
    """Max-min fair rate of every flow (water-filling).

    All unfrozen flows grow at the same pace; when a link fills up, the flows crossing it freeze
    at their current rate. The result: no link above capacity, and every flow crosses a saturated
    link on which no other flow gets more (its bottleneck)."""
    _validate(capacities, flows)
    remaining = dict(capacities)
    rates = dict.fromkeys(flows, 0.0)
    active = set(flows)
    while active:
        users: dict[str, int] = {}
        for flow in active:
            for link in flows[flow]:
                users[link] = users.get(link, 0) + 1
        step = min(remaining[link] / n for link, n in users.items())
        for flow in active:
            rates[flow] += step
        saturated = set()
        for link, n in users.items():
            remaining[link] -= step * n
            if remaining[link] <= _SATURATION_RTOL * capacities[link]:
                saturated.add(link)
        active = {f for f in active if not saturated.intersection(flows[f])}
    return rates


def completion_times_s(
    capacities: Mapping[str, float], flows: Mapping[str, Flow]
) -> dict[str, float]:
    """When each flow finishes, re-sharing bandwidth max-min fairly each time a flow starts or
    ends. Capacities are in bytes per second; a zero-byte flow finishes when it starts."""
    for name, flow in flows.items():
        if flow.nbytes < 0 or flow.start_s < 0:
            raise ValueError(f"flows: flow {name!r} needs nbytes >= 0 and start_s >= 0")
    _validate(capacities, {name: f.path for name, f in flows.items()})
    left = {name: float(f.nbytes) for name, f in flows.items()}
    done: dict[str, float] = {}
    now = 0.0
    while len(done) < len(flows):
        started = {n for n in flows if n not in done and flows[n].start_s <= now}
        for name in [n for n in started if left[n] <= 0]:
            done[name] = now
            started.discard(name)
        pending = [flows[n].start_s for n in flows if n not in done and flows[n].start_s > now]
        next_start = min(pending, default=math.inf)
        if not started:
            if next_start == math.inf:
                break
            now = next_start
            continue
        rates = max_min_rates(capacities, {n: flows[n].path for n in started})
        finish = {n: left[n] / rates[n] for n in started}
        step = min(min(finish.values()), next_start - now)
        now += step
        for name in started:
            if finish[name] <= step * (1 + _SATURATION_RTOL):  # ends in this step
                left[name] = 0.0
                done[name] = now
            else:
                left[name] -= rates[name] * step
    return done
