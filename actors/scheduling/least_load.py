"""`least_load`: the candidate with the fewest open tasks (ties: name order, deterministic)."""

from __future__ import annotations

from operator import attrgetter

from .decision import Candidate, Decision, RouteRequest, need_candidates, ranked

BY_LOAD = attrgetter("load", "te")  # C-level key: no Python call per candidate


def by_load(cands: tuple[Candidate, ...]) -> list[Candidate]:
    return sorted(cands, key=BY_LOAD)


def select_least_load(req: RouteRequest, cands: tuple[Candidate, ...]) -> Decision:
    need_candidates(cands, "least_load")
    order = by_load(cands)
    return Decision(policy="least_load", chosen=order[0].te, subgroup=order[0].subgroup,
                    ranked=ranked(order), reason=f"fewest open tasks ({order[0].load})",
                    order_by=("load",))
