"""Max-min fair sharing of link bandwidth among concurrent flows (progressive filling).

Pure functions: given link capacities and each flow's path, return each flow's rate; and, given
flow sizes and start times, when each flow completes as flows come and go. Used for PCIe shared
by a server's NPUs, KV transfers sharing RoCE, and anything else the emulator runs concurrently.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence

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


# ---- incremental max-min ------------------------------------------------------------------
# The fabric keeps thousands of flows in flight: recomputing every rate on every arrival or
# departure costs O(flows x rounds) per event. `MaxMinShare` keeps the allocation and repairs
# it locally: water-fill only the flows on the links a change touches (the others' rates are
# fixed and taken off the capacities), then check the max-min condition — every flow crosses a
# saturated link on which no flow gets more (its bottleneck) — on the links whose load moved.
# A flow failing it pulls the flows of its links into the next round. The region only grows,
# so this ends; a local change usually stays local. The result is the unique max-min
# allocation, up to float rounding (checked against an exact simulator in the tests).

_CHECK_RTOL = 1e-9  # slack of the bottleneck check: rates are sums of floats
_SAME_RTOL = 1e-12  # a recomputed rate this close to the old one is the old one (no re-anchor)


class MaxMinShare(Struct, kw_only=True):
    """Max-min fair rates of a changing set of flows, repaired incrementally.

    Mutable on purpose (an actor's state owns it; `add`, `remove` and `set_capacity` change it
    in place and return the flows whose rate changed). Iteration orders are insertion orders,
    so the same calls give the same floats in any process."""

    caps: dict[str, float] = {}  # capacity of every link that carries a flow
    paths: dict[str, tuple[str, ...]] = {}
    rates: dict[str, float] = {}
    users: dict[str, dict[str, None]] = {}  # link -> flows crossing it (an ordered set)

    def __deepcopy__(self, memo: dict) -> MaxMinShare:
        """Paths are tuples of str and rates floats: copying the containers is deep."""
        return MaxMinShare(
            caps=dict(self.caps), paths=dict(self.paths), rates=dict(self.rates),
            users={link: dict(flows) for link, flows in self.users.items()},
        )  # fmt: skip

    def add(
        self, flow: str, path: Sequence[str], capacity: Callable[[str], float]
    ) -> dict[str, float]:
        """Start `flow` over `path`; `capacity(link)` is asked for links not yet in use."""
        return self.add_many([(flow, path)], capacity)

    def add_many(
        self, flows: Sequence[tuple[str, Sequence[str]]], capacity: Callable[[str], float]
    ) -> dict[str, float]:
        """Start several flows at once (one repair for all: flows that start at the same
        instant, e.g. a burst of KV transfers, cost one water-filling, not one each)."""
        seeds: dict[str, None] = {}
        for flow, path in flows:
            if flow in self.paths:
                raise ValueError(f"flow: {flow!r} is already sharing")
            if not path or len(set(path)) != len(path):
                raise ValueError(f"path: flow {flow!r} needs distinct links, got {list(path)}")
            self.paths[flow] = tuple(path)
            self.rates[flow] = 0.0
            for link in path:
                users = self.users.get(link)
                if users is None:
                    cap = capacity(link)
                    if not cap >= 0:
                        raise ValueError(f"capacity: link {link!r} must be >= 0, got {cap}")
                    users = self.users[link] = {}
                    self.caps[link] = cap
                users[flow] = None
                seeds[link] = None
        changed = self._rerate(list(seeds))
        for flow, _ in flows:
            changed.setdefault(flow, self.rates[flow])
        return changed

    def remove(self, flow: str) -> dict[str, float]:
        """End `flow`; the flows that share its links get its bandwidth."""
        path = self.paths.pop(flow)
        del self.rates[flow]
        for link in path:
            users = self.users[link]
            del users[flow]
            if not users:
                del self.users[link], self.caps[link]
        return self._rerate([link for link in path if link in self.users])

    def set_capacity(self, link: str, cap: float) -> dict[str, float]:
        """A link's capacity changed (degraded, down = 0, repaired)."""
        if not cap >= 0:
            raise ValueError(f"capacity: link {link!r} must be >= 0, got {cap}")
        if link not in self.users:
            return {}
        self.caps[link] = cap
        return self._rerate([link])

    # ---- the repair ------------------------------------------------------------------
    def _rerate(self, seeds: Sequence[str]) -> dict[str, float]:
        users, rates, paths = self.users, self.rates, self.paths
        region: dict[str, float] = {}  # flow -> its rate before this change
        for link in seeds:
            for f in users[link]:
                region[f] = rates[f]
        while True:
            moved: dict[str, None] = dict.fromkeys(seeds)
            for f, rate in self._fill(region).items():
                cur = rates[f]
                if rate != cur and abs(rate - cur) > _SAME_RTOL * (rate if rate > cur else cur):
                    rates[f] = rate
                if rates[f] != region[f]:
                    for link in paths[f]:
                        moved[link] = None
            grew = False
            for v in self._violators(moved):
                for link in paths[v]:
                    for g in users[link]:
                        if g not in region:
                            region[g] = rates[g]
                            grew = True
            if not grew:  # the max-min condition holds, or the region is the whole component
                break
        return {f: rates[f] for f, old in region.items() if rates[f] != old}

    def _fill(self, region: Mapping[str, float]) -> dict[str, float]:
        """Water-fill the flows of `region`, the others' rates fixed: repeatedly take the link
        with the smallest fair share of what is left and freeze its flows at that share."""
        users, rates, paths, caps = self.users, self.rates, self.paths, self.caps
        members: dict[str, list[str]] = {}
        for f in region:
            for link in paths[f]:
                m = members.get(link)
                if m is None:
                    members[link] = [f]
                else:
                    m.append(f)
        residual: dict[str, float] = {}
        count: dict[str, int] = {}
        heap: list[tuple[float, str]] = []
        for link, m in members.items():
            us = users[link]
            left = caps[link]
            if len(us) != len(m):
                left -= sum([rates[g] for g in us if g not in region])
            n = len(m)
            residual[link], count[link] = left, n
            heap.append((left / n if left > 0 else 0.0, link))
        heapq.heapify(heap)
        out: dict[str, float] = {}
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            share, link = pop(heap)
            n = count[link]
            if not n:
                continue
            left = residual[link]
            if share != (left / n if left > 0 else 0.0):
                continue  # superseded by a later entry for this link
            for f in members[link]:
                if f in out:
                    continue
                out[f] = share
                for other in paths[f]:
                    left = residual[other] = residual[other] - share
                    n = count[other] = count[other] - 1
                    if n and other != link:
                        push(heap, (left / n if left > 0 else 0.0, other))
        return out

    def _violators(self, links: Mapping[str, None]) -> list[str]:
        """Flows on `links` without a bottleneck; also checks no link is over capacity."""
        users, rates, caps, paths = self.users, self.rates, self.caps, self.paths
        full: dict[str, float] = {}  # saturated link -> its largest rate; -1.0: not saturated
        bad: list[str] = []
        seen: set[str] = set()
        for link in links:
            for f in users.get(link, ()):
                if f in seen:
                    continue
                seen.add(f)
                rate = rates[f]
                for hop in paths[f]:
                    top = full.get(hop)
                    if top is None:
                        rs = [rates[g] for g in users[hop]]
                        load, cap = sum(rs), caps[hop]
                        if load > cap * (1 + _CHECK_RTOL) + 1e-9:
                            raise AssertionError(f"link {hop} carries {load} > capacity {cap}")
                        top = full[hop] = max(rs) if load >= cap * (1 - _CHECK_RTOL) else -1.0
                    if top >= 0 and rate >= top * (1 - _CHECK_RTOL):
                        break
                else:
                    bad.append(f)
        return bad
