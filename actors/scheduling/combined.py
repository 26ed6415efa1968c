"""`combined`: DeepServe Algorithm 1 — pd_aware narrows the group to a subgroup, then load_aware
over locality picks the TE: the longest prefix when load is balanced, else the least loaded."""

from __future__ import annotations

from .decision import Candidate, Decision, RouteRequest, need_candidates, ranked
from .load_aware import LoadAwareParams, load_aware_order
from .pd_aware import PdAwareParams, PdHeatmap, SubgroupChoice, choose_subgroup


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
