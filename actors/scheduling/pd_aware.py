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
from collections.abc import Sequence
from typing import NamedTuple

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
from .pool import Pool


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


class SubgroupChoice(NamedTuple):
    sub: Subgroup
    cell: HeatmapCell | None  # the heatmap cell that decided (None: one subgroup only)
    ratio: float  # the decode/prefill ratio used
    why: str
    inside: tuple[Candidate, ...]  # the candidates of `sub`, in the order given
    left_out: tuple[Excluded, ...]  # the other subgroup's TEs, with the reason


def choose_subgroup(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    p: PdAwareParams) -> SubgroupChoice:
    """The subgroup the heatmap's cell says, unless it is `subgroup_load_bound` busier."""
    # one partition, then each side's least-loaded TE's open tasks (a PD pair's: both sides)
    colo = [c for c in cands if c.subgroup == "colocated"]
    pd = [c for c in cands if c.subgroup != "colocated"]
    if not colo or not pd:
        return _only(req, cands[0].subgroup, cands, p)
    least_colo, least_pd = min([c.load for c in colo]), min([c.load + c.decode_load for c in pd])
    sub, cell, ratio, why = verdict(req, least_colo, least_pd, heatmap, p)
    inside, outside = (pd, colo) if sub == "pd" else (colo, pd)
    return SubgroupChoice(sub, cell, ratio, why, tuple(inside), (left_out(sub, [c.te for c in outside]),))


def choose_subgroup_pool(req: RouteRequest, pool: Pool, heatmap: PdHeatmap | None, p: PdAwareParams,
                         memo: dict[tuple[int, int | None], HeatmapVerdict] | None = None) -> SubgroupChoice:
    """`choose_subgroup` over a `Pool`: the same choice, with `Candidate` records built for the
    chosen subgroup's TEs only. `memo` keeps the heatmap's verdicts (`heatmap_verdict`) of one
    heatmap and `p` across decisions."""
    if not pool.colocated or not pool.prefill:
        only: Subgroup = "colocated" if pool.colocated else "pd"
        return _only(req, only, pool.candidates(only), p)
    sub, cell, ratio, why = verdict(req, pool.least("colocated"), pool.least("pd"), heatmap, p, memo)
    other: Subgroup = "colocated" if sub == "pd" else "pd"
    return SubgroupChoice(sub, cell, ratio, why, pool.candidates(sub), (left_out(sub, pool.names(other)),))


def _only(req: RouteRequest, only: Subgroup, inside: tuple[Candidate, ...], p: PdAwareParams) -> SubgroupChoice:
    ratio = predicted_decode_tokens(req, p) / max(req.prompt_tokens, 1)
    return SubgroupChoice(only, None, ratio, f"only {only} TEs in the group", inside, ())


def left_out(sub: Subgroup, outside: Sequence[str]) -> Excluded:
    other: Subgroup = "colocated" if sub == "pd" else "pd"
    return Excluded(tes=tuple(outside), subgroup=other, reason=f"not in the chosen subgroup ({sub})")


def verdict(req: RouteRequest, least_colo: int, least_pd: int, heatmap: PdHeatmap | None, p: PdAwareParams,
            memo: dict[tuple[int, int | None], HeatmapVerdict] | None = None) -> HeatmapVerdict:
    """(subgroup, the cell that decided, ratio, why) from each subgroup's least open tasks (a PD
    pair's: prefill + decode); `memo` keeps `heatmap_verdict` across decisions."""
    sub, cell, ratio, why = kept_verdict(req, heatmap, p, memo)
    other: Subgroup = "colocated" if sub == "pd" else "pd"
    least = {"colocated": least_colo, "pd": least_pd}
    if least[sub] > least[other] + p.subgroup_load_bound:
        why += overruled(sub, least[sub], least[other], p)
        sub = other
    return sub, cell, ratio, why


def overruled(sub: Subgroup, least_sub: int, least_other: int, p: PdAwareParams) -> str:
    """The reason's tail when `sub`'s least loaded is `subgroup_load_bound` busier than the other's."""
    other = "colocated" if sub == "pd" else "pd"
    return (f", but its least loaded has {least_sub} open > {other}'s {least_other} + "
            f"subgroup_load_bound {p.subgroup_load_bound}: {other}")


def kept_verdict(req: RouteRequest, heatmap: PdHeatmap | None, p: PdAwareParams,
                 memo: dict[tuple[int, int | None], HeatmapVerdict] | None) -> HeatmapVerdict:
    """`heatmap_verdict`, from `memo` when it holds the request's (prompt tokens, bucket)."""
    key = (req.prompt_tokens, req.predicted_bucket)
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        hit = heatmap_verdict(req, heatmap, p)
        if memo is not None:
            if len(memo) >= VERDICTS_KEPT:
                memo.clear()
            memo[key] = hit
    return hit


HeatmapVerdict = tuple[Subgroup, HeatmapCell, float, str]
# Verdicts a `Policy` keeps: one per (prompt tokens, predicted bucket) seen, at most this many
VERDICTS_KEPT = 4096


def heatmap_verdict(req: RouteRequest, heatmap: PdHeatmap | None, p: PdAwareParams) -> HeatmapVerdict:
    """What the heatmap's cell says for the request, before loads: a function of its prompt
    length and predicted bucket alone (so a `Policy` keeps it, `choose_subgroup_pool`'s memo)."""
    if heatmap is None:
        raise ValueError("pd_aware: the TE group has colocated and PD TEs but no heatmap was "
                         "given (scheduling.heatmap: run `deepserve profile heatmap`)")
    ratio = predicted_decode_tokens(req, p) / max(req.prompt_tokens, 1)
    cell = heatmap.cell(req.prompt_tokens, ratio)
    sub: Subgroup = "pd" if cell.value > 0 else "colocated"
    why = (f"heatmap cell (prefill>={cell.prefill_tokens_lo}, ratio>={cell.ratio_lo:g}) = "
           f"{cell.value:+.3f}: {sub}")
    return sub, cell, ratio, why


def select_pd_aware(req: RouteRequest, cands: tuple[Candidate, ...], heatmap: PdHeatmap | None,
                    p: PdAwareParams) -> Decision:
    need_candidates(cands, "pd_aware")
    return pd_aware_within(req, choose_subgroup(req, cands, heatmap, p), p)


def pd_aware_within(req: RouteRequest, ch: SubgroupChoice, p: PdAwareParams) -> Decision:
    """pd_aware's decision once the subgroup is chosen: its least-loaded TE."""
    order = by_load(ch.inside)
    return Decision(policy="pd_aware", params={"default_decode_tokens": float(p.default_decode_tokens),
                                               "subgroup_load_bound": float(p.subgroup_load_bound)},
                    chosen=order[0].te, subgroup=ch.sub, ranked=ranked(order),
                    reason=ch.why + f"; least loaded in it ({order[0].load} open)", heatmap_cell=ch.cell,
                    predicted_bucket=req.predicted_bucket, decode_ratio=ch.ratio, order_by=("load",),
                    excluded=ch.left_out)
