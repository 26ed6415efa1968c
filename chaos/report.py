"""What a chaos run prints: a line per failing seed (its first violated invariant, the step, the
log kept, the command that re-runs it) and the summary, as text or one JSON object.

`violations` counts the seeds that violated an invariant (each seed's first violation is listed
in `violation_list`; later ones are often consequences of it, and are counted per seed in
`checks_failed`). Everything but the wall-time fields is a function of the command line: the
same command twice gives the same `requests`, `faults_injected` and `violations`.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from .runner import SeedResult


def summary(results: list[SeedResult], wall_s: float, backend: str) -> dict[str, Any]:
    failing = [r for r in results if r.first is not None]
    return {
        "seeds": len(results),
        "requests": sum(r.requests for r in results),
        "completed": sum(r.completed for r in results),
        "failed": sum(r.failed for r in results),
        "faults_injected": sum(r.faults_injected for r in results),
        "violations": len(failing),
        "violation_list": [
            {"seed": r.seed, "invariant": r.first.invariant, "step": r.first.step, "t_s": r.first.t_s,  # type: ignore[union-attr]
             "actor": r.first.actor, "detail": r.first.detail, "checks_failed": r.violations, "log": r.log}  # type: ignore[union-attr]
            for r in failing
        ],  # fmt: skip
        "steps": sum(r.steps for r in results),
        "tokens_streamed": sum(r.tokens_streamed for r in results),
        # token chunks streamed for requests already terminal (no client sees them; work nobody
        # cancelled, e.g. a lost JE's tasks running on)
        "late_chunks": sum(r.late_chunks for r in results),
        # streams another task took over mid-way (a migrated request resuming on another TE, a
        # retry): each checked by the `migration` invariant
        "streams_taken_over": sum(r.taken_over for r in results),
        "backend": backend,
        "wall_s": round(wall_s, 3),
        "seeds_per_hour": round(len(results) / wall_s * 3600, 1) if wall_s > 0 else None,
    }


def failure_line(r: SeedResult, scenario: str, requests: int | None, overrides: Sequence[str] = ()) -> str:
    """The seed, its first violation, and the command that re-runs that seed alone."""
    v = r.first
    assert v is not None
    sets = "".join(f" --set {shlex.quote(o)}" for o in overrides)
    again = (f"deepserve chaos {shlex.quote(scenario)}{sets} --seeds 1 --first-seed {r.seed}"
             + (f" --requests {requests}" if requests else ""))  # fmt: skip
    return (f"seed {r.seed}: {v.invariant} violated at step {v.step} (t={v.t_s:g} s, {v.actor}): {v.detail}"
            f" [{r.violations} failed checks; log {r.log}; re-run: {again}]")  # fmt: skip


def text(s: dict[str, Any]) -> str:
    return (f"{s['seeds']} seeds, {s['requests']} requests ({s['completed']} completed, {s['failed']} failed), "
            f"{s['faults_injected']} faults injected, {s['violations']} seeds violated an invariant; "
            f"{s['wall_s']:g} s wall ({s['backend']}), {s['seeds_per_hour']} seeds/hour")  # fmt: skip
