"""Distributed scheduling policies of the JE (DeepServe §5, Algorithm 1), pure and unit-tested.

A module per paper concept: `round_robin`, `least_load`, `locality` (global prompt tree,
longest common prefix), `load_aware`, `pd_aware` (PD heatmap), `combined` (Algorithm 1), and
`forwarding` (P/D-Serve §3.5 on-demand offers). `Policy` selects one by name from config.
Every policy returns a `Decision` carrying the inputs it saw; the JE records it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .combined import combined_pool, select_combined
from .decision import Candidate, Decision, HeatmapCell, Ranked, RouteRequest
from .least_load import select_least_load
from .load_aware import LoadAwareParams, select_load_aware
from .locality import LocalityParams, PromptTree, select_locality
from .pd_aware import (
    HeatmapVerdict,
    PdAwareParams,
    PdHeatmap,
    choose_subgroup_pool,
    pd_aware_within,
    select_pd_aware,
)
from .pool import Pool
from .round_robin import select_round_robin

POLICIES = ("round_robin", "least_load", "locality", "load_aware", "pd_aware", "combined")
# The policy a `[scheduling]` section without `policy` runs: the one that measured best across
# the shipped traces in `deepserve bench policies` (docs/scheduling.md has the table): the best
# JCT p50 and p99 and twice round robin's prefix hits, its SLO attainment 0.01 below.
DEFAULT_POLICY = "load_aware"
PARAMS_OF = {"locality": (LocalityParams,), "load_aware": (LoadAwareParams,), "pd_aware": (PdAwareParams,),
             "combined": (PdAwareParams, LoadAwareParams)}


class Policy:
    """A named policy with its validated parameters (and the heatmap pd_aware/combined use)."""

    def __init__(self, name: str, params: dict[str, Any] | None = None,
                 heatmap: PdHeatmap | dict[str, Any] | None = None) -> None:
        if name not in POLICIES:
            raise ValueError(f"scheduling.policy: unknown policy {name!r}; known: {', '.join(POLICIES)}")
        params = dict(params or {})
        allowed = {f for cls in PARAMS_OF.get(name, ()) for f in cls.__struct_fields__}
        extra = sorted(set(params) - allowed)
        if extra:
            raise ValueError(f"scheduling.params.{extra[0]}: not a parameter of {name} "
                             f"(it has: {', '.join(sorted(allowed)) or 'none'})")
        try:
            self.load = msgspec.convert({k: v for k, v in params.items()
                                         if k in LoadAwareParams.__struct_fields__}, LoadAwareParams)
            self.loc = msgspec.convert({k: v for k, v in params.items()
                                        if k in LocalityParams.__struct_fields__}, LocalityParams)
            self.pd = msgspec.convert({k: v for k, v in params.items()
                                       if k in PdAwareParams.__struct_fields__}, PdAwareParams)
            self.heatmap = msgspec.convert(heatmap, PdHeatmap) if isinstance(heatmap, dict) else heatmap
        except msgspec.ValidationError as exc:
            raise ValueError(f"scheduling.params: {exc}") from None
        self.name = name
        # the heatmap's verdict per (prompt tokens, predicted bucket): a pure function of the
        # request and of this policy's heatmap and parameters, computed once (pd_aware.py)
        self.verdicts: dict[tuple[int, int | None], HeatmapVerdict] = {}

    def select(self, req: RouteRequest, cands: tuple[Candidate, ...], turn: int) -> Decision:
        n = self.name
        if n == "round_robin":
            return select_round_robin(req, cands, turn)
        if n == "least_load":
            return select_least_load(req, cands)
        if n == "locality":
            return select_locality(req, cands, self.loc)
        if n == "load_aware":
            return select_load_aware(req, cands, self.load)
        if n == "pd_aware":
            return select_pd_aware(req, cands, self.heatmap, self.pd)
        return select_combined(req, cands, self.heatmap, self.pd, self.load)

    def select_pool(self, req: RouteRequest, pool: Pool, turn: int) -> Decision:
        """`select` over a `Pool` (not empty): the same decision. pd_aware and combined choose
        the subgroup from each side's least load first, so only the chosen side's TEs become
        `Candidate` records (pool.py)."""
        n = self.name
        if n == "pd_aware":
            return pd_aware_within(req, choose_subgroup_pool(req, pool, self.heatmap, self.pd, self.verdicts), self.pd)
        if n == "combined":
            return combined_pool(req, pool, self.heatmap, self.pd, self.load, self.verdicts)
        return self.select(req, pool.all(), turn)


__all__ = [
    "DEFAULT_POLICY", "POLICIES", "Candidate", "Decision", "HeatmapCell", "LoadAwareParams", "LocalityParams", "PdAwareParams",
    "PdHeatmap", "Policy", "Pool", "PromptTree", "Ranked", "RouteRequest",
]
