"""The shapes of a batch's NPU run (split from actor.py by concept): a run whose first pass (and
lead passes) finish prompts before every pass decodes, as `DpMaster._launch` asks the NPU for
it, and the lead passes' durations read back from its answer."""

from __future__ import annotations

from deepserve.actors.flowserve.master.state import InFlight
from deepserve.actors.ports.npu import SeqShape


def _lead_shapes(head: tuple[SeqShape, ...], fl: InFlight) -> tuple[tuple[tuple[SeqShape, ...], ...], tuple[SeqShape, ...]]:
    """A run's lead passes as shapes (each entry's context: what it computed before the pass),
    and the decode passes' shapes after them (every entry, one new token each)."""
    if not fl.lead:  # a head run without lead passes (the common case): pass 1 decodes all
        return (), tuple([SeqShape(1, s.context_tokens + s.new_tokens) for s in head])
    computed = {e.task_id: s.context_tokens + s.new_tokens for e, s in zip(fl.entries, head, strict=True)}
    lead = []
    for entries in fl.lead:
        lead.append(tuple(SeqShape(x.n, computed[x.task_id]) for x in entries))
        for x in entries:
            computed[x.task_id] += x.n
    return tuple(lead), tuple(SeqShape(1, computed[e.task_id]) for e in fl.entries)


def _lead_s(ends_s: tuple[float, ...], fl: InFlight, gap_s: float) -> tuple[float, ...]:
    """The durations of the lead passes that ran (each started `gap_s` after the one before)."""
    return tuple(ends_s[j] - (ends_s[j - 1] + gap_s) for j in range(1, min(len(ends_s), 1 + len(fl.lead))))
