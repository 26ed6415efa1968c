"""Max-min fair sharing of link bandwidth among concurrent flows (progressive filling).

Pure functions: given link capacities and each flow's path, return each flow's rate; and, given
flow sizes and start times, when each flow completes as flows come and go. Used for PCIe shared
by a server's NPUs, KV transfers sharing RoCE, and anything else the emulator runs concurrently.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
# saturated link on which no flow gets more (its bottleneck) — where it can have broken. A
# flow failing it pulls the flows of its links into the next round. The region only grows,
# so this ends; a local change usually stays local. The result is the unique max-min
# allocation, up to float rounding (checked against an exact simulator in the tests).
#
# Where the check is needed: each flow remembers a link that was its bottleneck (`bneck`).
# - A flow of the region is frozen by the water-filling at a link that it fills: that link is
#   its bottleneck unless a fixed flow there gets more — one comparison, made while filling.
# - A fixed flow keeps its rate; its remembered bottleneck stays one unless that link's load
#   moved (a region flow on it changed rate). Only then are its links examined.
# A link's users change only by add/remove, which put all of them in the region, so a fixed
# flow's remembered bottleneck can go stale only by a load change, which is what is checked.

_CHECK_RTOL = 1e-9  # slack of the bottleneck check: rates are sums of floats
_SAME_RTOL = 1e-12  # a recomputed rate this close to the old one is the old one (no re-anchor)


class MaxMinShare(Struct, kw_only=True):
    """Max-min fair rates of a changing set of flows, repaired incrementally.

    Mutable on purpose (an actor's state owns it; `add`, `remove` and `set_capacity` change it
    in place and return the flows whose rate changed). Iteration orders are insertion orders,
    so the same calls give the same floats in any process.

    One record per flow and per link (a repair reads a flow's rate, path and bottleneck
    together: one lookup, not three dicts apart in memory); `rates`, `paths`, `bneck`,
    `users` and `caps` are read-only views."""

    flows: dict[str, list[Any]] = {}  # flow -> [rate, path (links), bottleneck link or None]
    links: dict[str, list[Any]] = {}  # link carrying a flow -> [capacity, {flows crossing it}]

    @property
    def rates(self) -> dict[str, float]:
        return {f: rec[0] for f, rec in self.flows.items()}

    @property
    def paths(self) -> dict[str, tuple[str, ...]]:
        return {f: tuple(rec[1]) for f, rec in self.flows.items()}

    @property
    def bneck(self) -> dict[str, str | None]:
        """flow -> a link of its path that is its bottleneck (max-min: saturated, no flow on
        it gets more)."""
        return {f: rec[2] for f, rec in self.flows.items()}

    @property
    def users(self) -> dict[str, dict[str, None]]:
        return {link: rec[1] for link, rec in self.links.items()}

    @property
    def caps(self) -> dict[str, float]:
        return {link: rec[0] for link, rec in self.links.items()}

    def __deepcopy__(self, memo: dict) -> MaxMinShare:
        """Paths are tuples of str, rates floats: copying the records is a deep copy."""
        return MaxMinShare(
            flows={f: list(rec) for f, rec in self.flows.items()},
            links={link: [rec[0], dict(rec[1])] for link, rec in self.links.items()},
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
        records, links = self.flows, self.links
        for flow, path in flows:
            if flow in records:
                raise ValueError(f"flow: {flow!r} is already sharing")
            if not path or len(set(path)) != len(path):
                raise ValueError(f"path: flow {flow!r} needs distinct links, got {list(path)}")
            records[flow] = [0.0, tuple(path), None]
            for link in path:
                lk = links.get(link)
                if lk is None:
                    cap = capacity(link)
                    if not cap >= 0:
                        raise ValueError(f"capacity: link {link!r} must be >= 0, got {cap}")
                    lk = links[link] = [cap, {}]
                lk[1][flow] = None
                seeds[link] = None
        changed = self._rerate(seeds)
        for flow, _ in flows:
            changed.setdefault(flow, records[flow][0])
        return changed

    def remove(self, flow: str) -> dict[str, float]:
        """End `flow`; the flows that share its links get its bandwidth."""
        rec = self.flows.pop(flow)
        seeds: dict[str, None] = {}
        for link in rec[1]:
            users = self.links[link][1]
            del users[flow]
            if users:
                seeds[link] = None
            else:
                del self.links[link]
        return self._rerate(seeds)

    def set_capacity(self, link: str, cap: float) -> dict[str, float]:
        """A link's capacity changed (degraded, down = 0, repaired)."""
        if not cap >= 0:
            raise ValueError(f"capacity: link {link!r} must be >= 0, got {cap}")
        lk = self.links.get(link)
        if lk is None:
            return {}
        lk[0] = cap
        return self._rerate({link: None}, every_user=True)

    # ---- the repair ------------------------------------------------------------------
    # Hot path of the fabric (two repairs per transfer). Written for CPython: locals over
    # attributes, no helper calls per flow, loops fused, one record per flow.
    def _rerate(self, seeds: Mapping[str, None], every_user: bool = False) -> dict[str, float]:
        """Repair after the users (or, `every_user`, the capacity) of the `seeds` links
        changed; returns the flows whose rate was set, with their rates. The first region is
        the flows whose bottleneck is a seed link (and new flows): a flow bottlenecked
        elsewhere keeps its rate unless the checks say otherwise (a fixed flow faster than
        the region's share on a seed link fails the fill's check). A capacity change starts
        from every user: a cut can overload a link with fixed flows."""
        records, links = self.flows, self.links
        region: dict[str, list[Any]] = {}  # flow -> its record
        for link in seeds:
            for f in links[link][1]:
                rec = records[f]
                if every_user or (b := rec[2]) is None or b in seeds:
                    region[f] = rec
        if not region:
            return {}
        touched: dict[str, None] = {}  # links with fixed flows whose load changed so far
        changed: dict[str, float] = {}
        while True:
            # A region flow without a bottleneck has a fixed flow on its links, so the region
            # grows; the fixed flows are checked once the fill itself holds.
            bad = self._fill(region, touched, changed)
            if not bad:
                if not touched:
                    break
                bad = self._stale_fixed(touched, region)
                if not bad:
                    break
            grew = False
            for v in bad:
                for link in records[v][1]:
                    for g in links[link][1]:
                        if g not in region:
                            region[g] = records[g]
                            grew = True
            if not grew:  # float noise on a whole component: nothing left to pull in
                break
        return changed

    def _fill(
        self, region: Mapping[str, list[Any]], touched: dict[str, None], changed: dict[str, float]
    ) -> list[str]:
        """Water-fill the flows of `region`, the others' rates fixed: repeatedly take the link
        with the smallest fair share of what is left and freeze its flows at that share.
        Sets their rates (noted in `changed`; their links that carry fixed flows in
        `touched`) and bottlenecks;
        returns the flows frozen at a link where a fixed flow gets more (they have no
        bottleneck: the region must grow)."""
        records, links = self.flows, self.links
        # link -> [capacity left, region flows not yet frozen, largest fixed rate (-1.0: no
        # fixed flow), region flows]
        work: dict[str, list[Any]] = {}
        for f, rec in region.items():
            for link in rec[1]:
                w = work.get(link)
                if w is None:
                    work[link] = [0.0, 1, -1.0, [f]]
                else:
                    w[1] += 1
                    w[3].append(f)
        heap: list[tuple[float, str]] = []
        for link, w in work.items():
            left, us = links[link]
            n = w[1]
            if len(us) != n:
                top = 0.0
                for g in us:
                    if g not in region:
                        r = records[g][0]
                        left -= r
                        if r > top:
                            top = r
                w[2] = top
            w[0] = left
            heap.append((left / n if left > 0 else 0.0, link))
        if len(heap) > 1:
            heapq.heapify(heap)
        # A link's share only rises as flows freeze elsewhere (each takes at most the share of
        # every link it crosses), so a heap entry is a lower bound: a popped entry that is out
        # of date goes back with the current share, and an up-to-date one is the minimum.
        frozen: dict[str, None] = {}
        bad: list[str] = []
        pop, push = heapq.heappop, heapq.heappush
        unfrozen = len(region)
        while unfrozen:
            share, link = pop(heap)
            w = work[link]
            n = w[1]
            if not n:
                continue
            left = w[0]
            now = left / n if left > 0 else 0.0
            if now != share:
                push(heap, (now, link))
                continue
            ok = share >= w[2] * (1 - _CHECK_RTOL)
            for f in w[3]:
                if f in frozen:
                    continue
                frozen[f] = None
                unfrozen -= 1
                rec = region[f]
                cur = rec[0]
                if share != cur and abs(share - cur) > _SAME_RTOL * (share if share > cur else cur):
                    rec[0] = changed[f] = share
                    for hop in rec[1]:
                        if work[hop][2] >= 0:  # only fixed flows need the moved links
                            touched[hop] = None
                rec[2] = link
                if not ok:
                    bad.append(f)
                for other in rec[1]:
                    o = work[other]
                    o[0] -= share
                    o[1] -= 1
        return bad

    def _stale_fixed(self, moved: Mapping[str, None], region: Mapping[str, list[Any]]) -> list[str]:
        """Fixed flows on `moved` links whose remembered bottleneck is one of them and that
        have no bottleneck now; also checks no link they cross is over capacity.

        `moved` holds every link with fixed flows whose load changed in any round of this
        repair (a link without fixed flows keeps none: the region only grows): a
        bottleneck found in an earlier round on a link that moved since is checked again,
        and one on a link that never moved holds as it did when it was found."""
        records, links = self.flows, self.links
        full: dict[str, float] = {}  # saturated link -> its largest rate; -1.0: not saturated
        bad: list[str] = []
        seen: dict[str, None] = {}
        for link in moved:
            for g in links[link][1]:
                if g in region or g in seen:
                    continue
                rec = records[g]
                if rec[2] not in moved:
                    continue
                seen[g] = None
                rate = rec[0]
                for hop in rec[1]:
                    top = full.get(hop)
                    if top is None:
                        top = full[hop] = _saturation(links[hop], records, hop)
                    if top >= 0 and rate >= top * (1 - _CHECK_RTOL):
                        rec[2] = hop
                        break
                else:
                    bad.append(g)
        return bad


def _saturation(lk: list[Any], records: Mapping[str, list[Any]], link: str) -> float:
    """The largest rate on a saturated link, -1.0 on one that is not; raises if over capacity."""
    cap, flows = lk
    if len(flows) == 1:
        for g in flows:
            load = top = records[g][0]
    else:
        rs = [records[g][0] for g in flows]
        load, top = sum(rs), max(rs)
    if load > cap * (1 + _CHECK_RTOL) + 1e-9:
        raise AssertionError(f"link {link} carries {load} > capacity {cap}")
    return top if load >= cap * (1 - _CHECK_RTOL) else -1.0
