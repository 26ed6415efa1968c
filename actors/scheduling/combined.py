"""`combined`: DeepServe Algorithm 1 — pd_aware narrows the group to a subgroup, then load_aware
over locality picks the TE: the longest prefix when load is balanced, else the least loaded."""

from __future__ import annotations

import msgspec

from .decision import Candidate, Decision, RouteRequest, need_candidates
from .load_aware import LoadAwareParams, select_load_aware
from .pd_aware import PdAwareParams, PdHeatmap, SubgroupChoice, choose_subgroup


def select_combined(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    pd: PdAwareParams, load: LoadAwareParams) -> Decision:
    need_candidates(cands, "combined")
    return combined_within(req, choose_subgroup(req, cands, heatmap, pd), pd, load)


def combined_within(req: RouteRequest, ch: SubgroupChoice, pd: PdAwareParams, load: LoadAwareParams) -> Decision:
    """Algorithm 1 once pd_aware chose the subgroup: load_aware over locality inside it."""
    inner = select_load_aware(req, ch.inside, load, "combined")
    params = dict(inner.params, default_decode_tokens=float(pd.default_decode_tokens),
                  subgroup_load_bound=float(pd.subgroup_load_bound))
    return msgspec.structs.replace(
        inner, params=params, reason=f"{ch.why}; {inner.reason}", heatmap_cell=ch.cell,
        predicted_bucket=req.predicted_bucket, decode_ratio=ch.ratio, excluded=ch.left_out + inner.excluded,
    )  # fmt: skip
