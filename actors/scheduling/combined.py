"""`combined`: DeepServe Algorithm 1 — pd_aware narrows the group to a subgroup, then load_aware
over locality picks the TE: the longest prefix when load is balanced, else the least loaded."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import repeat

from .decision import Candidate, Decision, RouteRequest, Subgroup, need_candidates, ranked
from .load_aware import LoadAwareParams, load_aware_order, load_aware_why
from .pd_aware import (
    HeatmapVerdict,
    PdAwareParams,
    PdHeatmap,
    SubgroupChoice,
    choose_subgroup,
    choose_subgroup_pool,
    kept_verdict,
    left_out,
    overruled,
)
from .pool import Pool


def select_combined(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    pd: PdAwareParams, load: LoadAwareParams) -> Decision:
    need_candidates(cands, "combined")
    return combined_within(req, choose_subgroup(req, cands, heatmap, pd), pd, load)


def combined_within(req: RouteRequest, ch: SubgroupChoice, pd: PdAwareParams, load: LoadAwareParams) -> Decision:
    """Algorithm 1 once pd_aware chose the subgroup: load_aware over locality inside it."""
    need_candidates(ch.inside, "combined")
    order, key, why, spread = load_aware_order(req, ch.inside, load)
    params = {"threshold": float(load.threshold), "default_decode_tokens": float(pd.default_decode_tokens),
              "subgroup_load_bound": float(pd.subgroup_load_bound)}
    return Decision(policy="combined", params=params, chosen=order[0].te, subgroup=order[0].subgroup,
                    ranked=ranked(order), reason=f"{ch.why}; {why}", imbalance=spread, heatmap_cell=ch.cell,
                    predicted_bucket=req.predicted_bucket, decode_ratio=ch.ratio, order_by=key,
                    excluded=ch.left_out)


def combined_pool(req: RouteRequest, pool: Pool, heatmap: PdHeatmap | None, pd: PdAwareParams,
                  load: LoadAwareParams, memo: dict[tuple[int, int | None], HeatmapVerdict] | None = None
                  ) -> Decision:  # fmt: skip
    """`select_combined` over a `Pool`, the same decision (tests/actors/scheduling/test_pool.py)
    at the cost of one pass of C-level look-ups per subgroup: the chosen subgroup is ranked as
    (load, name) or (-prefix, load, name) tuples, and only its TEs become `Candidate` records."""
    if not pool.colocated or not pool.prefill:
        return combined_within(req, choose_subgroup_pool(req, pool, heatmap, pd, memo), pd, load)
    hit = memo.get((req.prompt_tokens, req.predicted_bucket)) if memo is not None else None
    sub, cell, ratio, why = hit if hit is not None else kept_verdict(req, heatmap, pd, memo)
    names = pool.prefill if sub == "pd" else pool.colocated
    loads = list(map(pool.load.get, names, repeat(0)))
    dl = pool.decode_load if sub == "pd" else 0
    lo = min(loads)
    if lo + dl > pd.subgroup_load_bound:  # else the other side cannot be `bound` less loaded: not read
        onames, oloads, odl = _side(pool, "colocated" if sub == "pd" else "pd")
        if lo + dl > min(oloads) + odl + pd.subgroup_load_bound:
            why += overruled(sub, lo + dl, min(oloads) + odl, pd)
            sub, names, loads, dl = "colocated" if sub == "pd" else "pd", onames, oloads, odl
            lo = min(loads)
    held = list(map(pool.held.get, names, repeat(0)))
    spread = max(loads) - lo
    # by_load's order (load, te), or by_prefix's (-prefix_blocks, load, te): positions sorted on
    # int keys (C-level compares), stable sorts from name order — not tuples compared field by field
    at = sorted(name_order(tuple(names)), key=loads.__getitem__)
    if spread <= load.threshold:
        at.sort(key=held.__getitem__, reverse=True)  # reverse keeps the ties' (load, te) order
    order = tuple([Candidate(te=names[i], subgroup=sub, load=loads[i], prefix_blocks=held[i], decode_load=dl)
                   for i in at])  # fmt: skip
    key, inner = load_aware_why(req, spread, load, order[0])
    return Decision(policy="combined", params=_params(pd, load), chosen=order[0].te, subgroup=sub,
                    ranked=order, reason=f"{why}; {inner}", imbalance=spread, heatmap_cell=cell,
                    predicted_bucket=req.predicted_bucket, decode_ratio=ratio, order_by=key,
                    excluded=(left_out(sub, pool.prefill if sub == "colocated" else pool.colocated),))


@functools.lru_cache(maxsize=64)
def name_order(names: tuple[str, ...]) -> tuple[int, ...]:
    """Positions of `names` in name order: the ties' order, a function of the group's list
    (which changes with membership, not per request)."""
    return tuple(sorted(range(len(names)), key=names.__getitem__))


def _params(pd: PdAwareParams, load: LoadAwareParams) -> dict[str, float]:
    return {"threshold": float(load.threshold), "default_decode_tokens": float(pd.default_decode_tokens),
            "subgroup_load_bound": float(pd.subgroup_load_bound)}


def _side(pool: Pool, sub: Subgroup) -> tuple[Sequence[str], list[int], int]:
    """(a subgroup's TEs, their open tasks, the decode load a PD pair adds)."""
    names = pool.names(sub)
    return names, list(map(pool.load.get, names, repeat(0))), pool.decode_load if sub == "pd" else 0
