"""The candidates of one decision, kept by subgroup as TE names until a policy reads them.

The JE hands `Policy.select_pool` a `Pool` instead of a `Candidate` per TE: a policy that first
narrows the group to one subgroup (pd_aware, combined: DeepServe Algorithm 1) reads only each
subgroup's least load, then builds `Candidate` records for the TEs it ranks — 16 of the 48 in
`deepserve bench routing`, where building all 48 was a third of a decision's cost. The records
are the ones `candidates()` would have built, in the same order, so the decision (and the log)
is the same either way (tests/actors/scheduling/test_pool.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat

from .decision import Candidate, Subgroup


class Pool:
    """TEs that may take a job's chat-or-prefill task: `colocated` and `prefill` names (already
    without the failed and the set-aside ones), their open tasks (`load`), the prompt blocks each
    holds (`held`) and a prefill's PD-pair decode load (the least-loaded decode TE's)."""

    __slots__ = ("colocated", "decode_load", "held", "load", "prefill")

    def __init__(self, colocated: Sequence[str], prefill: Sequence[str], load: Mapping[str, int],
                 held: Mapping[str, int], decode_load: int = 0) -> None:  # fmt: skip
        self.colocated = colocated
        self.prefill = prefill
        self.load = load
        self.held = held
        self.decode_load = decode_load

    def __bool__(self) -> bool:
        return bool(self.colocated or self.prefill)

    def names(self, sub: Subgroup) -> Sequence[str]:
        return self.colocated if sub == "colocated" else self.prefill

    def least(self, sub: Subgroup) -> int:
        """The subgroup's least open tasks (a PD pair's: prefill + decode); the subgroup is not empty."""
        if sub == "colocated":  # map: the lookups run in C, no Python frame per TE
            return min(map(self.load.get, self.colocated, repeat(0)))
        return min(map(self.load.get, self.prefill, repeat(0))) + self.decode_load

    def candidates(self, sub: Subgroup) -> tuple[Candidate, ...]:
        load, held = self.load.get, self.held.get
        if sub == "colocated":
            return tuple([Candidate(te=te, subgroup="colocated", load=load(te, 0), prefix_blocks=held(te, 0))
                          for te in self.colocated])  # fmt: skip
        dl = self.decode_load
        return tuple([Candidate(te=te, subgroup="pd", load=load(te, 0), prefix_blocks=held(te, 0), decode_load=dl)
                      for te in self.prefill])  # fmt: skip

    def all(self) -> tuple[Candidate, ...]:
        """Every candidate, colocated first (the order `routing.candidates` gives)."""
        return self.candidates("colocated") + self.candidates("pd")
