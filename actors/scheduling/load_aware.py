"""`load_aware`: keep the locality choice unless the load is unbalanced (DeepServe §5.4).

Imbalance is the spread of open tasks over the candidates, `max - min`; beyond `threshold` the
least-loaded candidate wins (a prefix hit is not worth queueing behind a hot TE), otherwise the
locality ranking stands.
"""

from __future__ import annotations

import msgspec

from .decision import Candidate, Decision, RouteRequest, need_candidates, ranked
from .least_load import by_load
from .locality import PREFIX_ORDER, by_prefix


class LoadAwareParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    threshold: int = 4  # open tasks of spread tolerated before load overrides locality

    def __post_init__(self) -> None:
        if self.threshold < 0:
            raise ValueError(f"scheduling.params.threshold: must be >= 0, got {self.threshold}")


def imbalance(cands: tuple[Candidate, ...]) -> int:
    loads = [c.load for c in cands]
    return max(loads) - min(loads)


def load_aware_order(req: RouteRequest, cands: tuple[Candidate, ...], p: LoadAwareParams
                     ) -> tuple[list[Candidate], tuple[str, ...], str, int]:  # fmt: skip
    """(the candidates best first, the fields the order compares, why, the imbalance)."""
    spread = imbalance(cands)
    order = by_load(cands) if spread > p.threshold else by_prefix(cands)
    key, why = load_aware_why(req, spread, p, order[0])
    return order, key, why, spread


def load_aware_why(req: RouteRequest, spread: int, p: LoadAwareParams, best: Candidate) -> tuple[tuple[str, ...], str]:
    """(the fields the order compared, why) once the candidates are ranked and `best` is first."""
    if spread > p.threshold:
        return ("load",), f"imbalance {spread} > threshold {p.threshold}: least loaded ({best.load} open)"
    return PREFIX_ORDER, (f"imbalance {spread} <= threshold {p.threshold}: longest prefix "
                          f"({best.prefix_blocks} of {req.prompt_blocks} blocks)")


def select_load_aware(req: RouteRequest, cands: tuple[Candidate, ...], p: LoadAwareParams,
                      policy: str = "load_aware") -> Decision:
    need_candidates(cands, policy)
    order, key, why, spread = load_aware_order(req, cands, p)
    return Decision(policy=policy, params={"threshold": float(p.threshold)}, chosen=order[0].te,
                    subgroup=order[0].subgroup, ranked=ranked(order), reason=why, imbalance=spread, order_by=key)
