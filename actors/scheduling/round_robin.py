"""`round_robin`: the baseline — candidates in turn, ignoring load and cache."""

from __future__ import annotations

from .decision import Candidate, Decision, RouteRequest, need_candidates, ranked


def select_round_robin(req: RouteRequest, cands: tuple[Candidate, ...], turn: int) -> Decision:
    """The candidate at `turn` (the JE's counter of round-robin decisions) modulo their count."""
    need_candidates(cands, "round_robin")
    k = turn % len(cands)
    order = cands[k:] + cands[:k]
    return Decision(policy="round_robin", params={"turn": float(turn)}, chosen=order[0].te,
                    subgroup=order[0].subgroup, ranked=ranked(order),
                    reason=f"turn {turn} of {len(cands)} candidates")
