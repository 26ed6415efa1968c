"""`pd_aware`: choose the PD-colocated or PD-disaggregated subgroup from the PD heatmap
(DeepServe §5.3, select-tes-PD-heatmap).

The heatmap (written by `deepserve profile heatmap`, DeepServe Fig. 6) has one cell per
(prefill length, decode/prefill ratio); its value is JCT(colocated) / JCT(PD) - 1 summed over the
profiled RPS values, so > 0 means PD-disaggregated was faster. The request's cell is found from
its prompt length and its *predicted* decode length (the predictor's 128-token bucket: its
middle), since the true decode length is unknown at arrival. Within the chosen subgroup the least
loaded TE wins (standalone); `combined` refines the subgroup with load_aware/locality instead.
Without a heatmap the policy cannot choose and says so (a config error, not a silent default).
"""

from __future__ import annotations

import bisect

import msgspec

from .decision import (
    DECODE_BUCKET_TOKENS,
    Candidate,
    Decision,
    Excluded,
    HeatmapCell,
    RouteRequest,
    Subgroup,
    need_candidates,
    ranked,
)
from .least_load import by_load


class PdHeatmap(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    prefill_edges: tuple[int, ...]  # lower bound of each row, ascending (tokens)
    ratio_edges: tuple[float, ...]  # lower bound of each column, ascending (decode / prefill)
    values: tuple[tuple[float, ...], ...]  # [row][column]: sum over RPS of JCT_colo/JCT_pd - 1
    model: str = ""
    rps: tuple[float, ...] = ()  # the RPS values summed (provenance)

    def __post_init__(self) -> None:
        if not self.prefill_edges or not self.ratio_edges:
            raise ValueError("heatmap: prefill_edges and ratio_edges must not be empty")
        if list(self.prefill_edges) != sorted(self.prefill_edges) or \
                list(self.ratio_edges) != sorted(self.ratio_edges):
            raise ValueError("heatmap: edges must be ascending")
        if len(self.values) != len(self.prefill_edges) or \
                any(len(r) != len(self.ratio_edges) for r in self.values):
            raise ValueError(f"heatmap.values: must be {len(self.prefill_edges)} rows of "
                             f"{len(self.ratio_edges)} columns")

    def cell(self, prefill_tokens: int, ratio: float) -> HeatmapCell:
        i = max(0, bisect.bisect_right(self.prefill_edges, prefill_tokens) - 1)
        j = max(0, bisect.bisect_right(self.ratio_edges, ratio) - 1)
        return HeatmapCell(prefill_tokens_lo=self.prefill_edges[i], ratio_lo=self.ratio_edges[j],
                           value=self.values[i][j])


class PdAwareParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Without a predicted bucket (no predictor configured) the decode length assumed, in tokens.
    default_decode_tokens: int = 256
    # The heatmap's subgroup is kept unless its least-loaded TE (a PD pair: prefill + decode
    # open tasks) has more than this many open tasks above the other subgroup's: without a
    # bound one PD pair took 296 of 300 agentic requests (TPOT +56 %).
    subgroup_load_bound: int = 4

    def __post_init__(self) -> None:
        if self.subgroup_load_bound < 0:
            raise ValueError(f"scheduling.params.subgroup_load_bound: must be >= 0, got {self.subgroup_load_bound}")


def predicted_decode_tokens(req: RouteRequest, p: PdAwareParams) -> int:
    if req.predicted_bucket is None:
        return p.default_decode_tokens
    return req.predicted_bucket * DECODE_BUCKET_TOKENS + DECODE_BUCKET_TOKENS // 2


def choose_subgroup(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    p: PdAwareParams) -> tuple[Subgroup, HeatmapCell | None, float, str]:
    """(subgroup, the cell that decided or None, the decode ratio used, why)."""
    # each subgroup's least-loaded TE's open tasks (a PD pair's: both sides); generators, not a
    # loop: this runs on every request's decision (`deepserve bench routing`)
    least = {"colocated": min((c.load for c in cands if c.subgroup == "colocated"), default=None),
             "pd": min((c.load + c.decode_load for c in cands if c.subgroup == "pd"), default=None)}
    ratio = predicted_decode_tokens(req, p) / max(req.prompt_tokens, 1)
    if least["colocated"] is None or least["pd"] is None:
        only: Subgroup = cands[0].subgroup
        return only, None, ratio, f"only {only} TEs in the group"
    if heatmap is None:
        raise ValueError("pd_aware: the TE group has colocated and PD TEs but no heatmap was "
                         "given (scheduling.heatmap: run `deepserve profile heatmap`)")
    cell = heatmap.cell(req.prompt_tokens, ratio)
    sub: Subgroup = "pd" if cell.value > 0 else "colocated"
    why = (f"heatmap cell (prefill>={cell.prefill_tokens_lo}, ratio>={cell.ratio_lo:g}) = "
           f"{cell.value:+.3f}: {sub}")
    other: Subgroup = "colocated" if sub == "pd" else "pd"
    if least[sub] > least[other] + p.subgroup_load_bound:  # type: ignore[operator]
        why += (f", but its least loaded has {least[sub]} open > {other}'s {least[other]} + "
                f"subgroup_load_bound {p.subgroup_load_bound}: {other}")
        sub = other
    return sub, cell, ratio, why


def other_subgroup(cands: tuple[Candidate, ...], sub: Subgroup) -> tuple[Excluded, ...]:
    tes = tuple(c.te for c in cands if c.subgroup != sub)
    other: Subgroup = "colocated" if sub == "pd" else "pd"
    return (Excluded(tes=tes, subgroup=other, reason=f"not in the chosen subgroup ({sub})"),) if tes else ()


def select_pd_aware(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    p: PdAwareParams) -> Decision:
    need_candidates(cands, "pd_aware")
    sub, cell, ratio, why = choose_subgroup(req, cands, heatmap, p)
    order = by_load(tuple(c for c in cands if c.subgroup == sub))
    return Decision(policy="pd_aware", params={"default_decode_tokens": float(p.default_decode_tokens),
                                               "subgroup_load_bound": float(p.subgroup_load_bound)},
                    chosen=order[0].te, subgroup=sub, ranked=ranked(order),
                    reason=why + f"; least loaded in it ({order[0].load} open)", heatmap_cell=cell,
                    predicted_bucket=req.predicted_bucket, decode_ratio=ratio, order_by=("load",),
                    excluded=other_subgroup(cands, sub))
