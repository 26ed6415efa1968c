"""What a routing policy sees and what it decides — plain data, so the decision can be recorded
as an event and `deepserve replay why` can print it from the log alone.

A `Candidate` is one TE the request could go to (for a PD pair: its prefill TE), with the numbers
the policies compare: `load` (tasks the JE has open on it: P/D-Serve's "open streams", known at
once and exactly, unlike a periodic load report) and `prefix_blocks` (leading prompt blocks the
global prompt tree says the TE holds). A `Decision` carries the candidates ranked, the policy, its
parameters and the intermediate facts (heatmap cell, predicted bucket, imbalance) that decided.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Subgroup = Literal["colocated", "pd"]
DECODE_BUCKET_TOKENS = 128  # DeepServe §5.3.3: decode lengths classified into 128-token buckets


class Candidate(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # no cycles: str and int fields
    te: str
    subgroup: Subgroup = "colocated"
    load: int = 0  # open tasks from this JE on the TE
    prefix_blocks: int = 0  # leading prompt blocks the TE is believed to hold
    # a prefill TE (subgroup "pd"): open tasks on the least-loaded decode TE its KV would go
    # to — the pair's load is `load + decode_load` (a PD pair is busy decoding, not prefilling)
    decode_load: int = 0


class RouteRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # no cycles: str and int fields
    request_id: str
    prompt_tokens: int
    prompt_blocks: int = 0
    predicted_bucket: int | None = None  # decode length // 128, from the predictor (None: none)


class HeatmapCell(msgspec.Struct, frozen=True, kw_only=True):
    """The PD heatmap square a request fell in: value > 0 means PD-disaggregated was faster
    (JCT colocated / JCT PD - 1, summed over the profiled RPS values, DeepServe §5.3.2)."""

    prefill_tokens_lo: int
    ratio_lo: float
    value: float


# A ranked candidate is the candidate itself: the decision records exactly what the policy saw
# (and copying 64 of them per decision was a third of its cost).
Ranked = Candidate


class Excluded(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # no cycles: str fields
    """TEs of the group the decision did not rank, and why (failed this job, set aside,
    refused this sweep, the other subgroup, over the load bound): `replay why` lists them.
    One record per reason (the 32 TEs of the other subgroup share one)."""

    tes: tuple[str, ...]
    subgroup: Subgroup
    reason: str


# gc=False: a decision is made per request and refers to nothing that refers back to it (its
# fields are fresh tuples, a dict of floats and frozen records), so the collector need not track it
class Decision(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    policy: str
    params: dict[str, float] = {}
    chosen: str = ""
    subgroup: Subgroup = "colocated"
    ranked: tuple[Ranked, ...] = ()  # best first; `chosen` is ranked[0].te
    reason: str = ""  # one sentence: which rule decided
    imbalance: int | None = None  # load_aware: max - min load over the candidates
    heatmap_cell: HeatmapCell | None = None
    predicted_bucket: int | None = None
    decode_ratio: float | None = None  # predicted decode length / prefill length
    # the Ranked fields the order compares, most significant first (ties beyond them: TE name;
    # empty: an order that compares no field, round robin's turn)
    order_by: tuple[str, ...] = ()
    excluded: tuple[Excluded, ...] = ()  # TEs of the group not ranked, with the reason


def ranked(cands: list[Candidate] | tuple[Candidate, ...]) -> tuple[Ranked, ...]:
    return tuple(cands)



def need_candidates(cands: tuple[Candidate, ...] | list[Candidate], policy: str) -> None:
    if not cands:
        raise ValueError(f"{policy}: no candidate TE (the TE group is empty)")
