"""An independent max-min fair-share simulator for the tests: textbook progressive filling in
exact rational arithmetic, and an event-driven simulation of flows coming and going on top of
it. Slow and simple on purpose — it shares no code with fairshare.py or the fabric.

Progressive filling: every flow not yet frozen grows at the same pace; when a link is full,
the flows crossing it freeze. With Fractions "full" is exact, so there is no tolerance to argue
about.
"""

from __future__ import annotations

from fractions import Fraction

Q = Fraction


def max_min(caps: dict[str, Q], paths: dict[str, tuple[str, ...]]) -> dict[str, Q]:
    rates = {f: Q(0) for f in paths}
    frozen: set[str] = set()

    def load(link: str) -> Q:
        return sum((rates[f] for f in paths if link in paths[f]), Q(0))

    while len(frozen) < len(paths):
        growing = {
            link: sum(1 for f in paths if f not in frozen and link in paths[f]) for link in caps
        }
        step = min((caps[link] - load(link)) / n for link, n in growing.items() if n)
        for f in paths:
            if f not in frozen:
                rates[f] += step
        full = {link for link in caps if load(link) == caps[link]}
        frozen |= {f for f in paths if full.intersection(paths[f])}
    return rates


def simulate(
    caps: dict[str, Q],
    flows: dict[str, tuple[tuple[str, ...], Q, Q]],  # name -> (path, bytes, start time)
    cap_changes: list[tuple[Q, str, Q]] = (),  # (time, link, new capacity)
) -> dict[str, Q | None]:
    """When each flow completes (None: never, e.g. its link went to 0 and stayed there)."""
    caps = dict(caps)
    left = {f: nbytes for f, (_, nbytes, _) in flows.items()}
    done: dict[str, Q | None] = {}
    changes = sorted(cap_changes)
    now = Q(0)
    while True:
        while changes and changes[0][0] <= now:
            _, link, cap = changes.pop(0)
            caps[link] = cap
        active = {f for f, (_, _, start) in flows.items() if start <= now and f not in done}
        for f in sorted(active):
            if left[f] == 0:
                done[f] = now
        active = {f for f in active if f not in done}
        rates = max_min(caps, {f: flows[f][0] for f in active}) if active else {}
        events = [start for _, _, start in flows.values() if start > now]
        events += [t for t, _, _ in changes]
        events += [now + left[f] / r for f, r in rates.items() if r > 0]
        if not events:
            break
        nxt = min(events)
        for f, r in rates.items():
            left[f] -= r * (nxt - now)
        now = nxt
    for f in flows:
        done.setdefault(f, None)
    return done
