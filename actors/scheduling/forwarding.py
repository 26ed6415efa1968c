"""P/D-Serve §3.5 on-demand forwarding, as a pure offer plan.

A prefill instance accepts or rejects (no local queue). The requester offers the request to the
prefill with the fewest open streams, then to the next candidates in that order, until one
accepts or the request's TTFT deadline passes; after the last candidate it starts again from the
(now re-ranked) best, waiting `retry_backoff_s` between sweeps. `next_offer` is that rule: given
who already refused in this sweep and the clock, the next TE or why to stop.
"""

from __future__ import annotations

import msgspec

from .decision import Candidate

# The refusals that mean "busy now, ask again" (the master's bounded queue, the TE shell's
# dispatch queue). Every other refusal is permanent for that TE ("device lost: ...", a model it
# does not serve, a prompt it cannot hold): re-offering cannot succeed, so the JE sets the TE
# aside instead of sweeping it again until the TTFT deadline.
BUSY_REFUSALS = ("queue full", "TE dispatch queue full")


# The permanent refusals about the TE itself rather than the task: no other task should be
# offered to it either for a while (`PrefillSetAside`, as after a failed KV transfer).
TE_DOWN_REFUSALS = ("device lost", "model:", "no DP group answered")


def is_busy(reason: str) -> bool:
    return reason.startswith(BUSY_REFUSALS)


def te_down(reason: str) -> bool:
    return reason.startswith(TE_DOWN_REFUSALS)


class ForwardingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    mode: str = "on_demand"  # or "local_queue": the TE queues (the baseline P/D-Serve replaces)
    ttft_deadline_s: float = 10.0  # give up offering after this long since arrival
    retry_backoff_s: float = 0.005  # pause after every candidate refused, before the next sweep
    max_backoff_s: float = 0.5  # the pause doubles per sweep that finds no idle prefill, up to this
    accept_timeout_s: float = 1.0  # a TE that neither accepts nor rejects by then counts as dead

    def __post_init__(self) -> None:
        if self.mode not in ("on_demand", "local_queue"):
            raise ValueError(f"scheduling.forwarding.mode: {self.mode!r}; known: on_demand, local_queue")
        for name in ("ttft_deadline_s", "retry_backoff_s", "max_backoff_s", "accept_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"scheduling.forwarding.{name}: must be > 0")


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    te: str | None  # the TE to offer to now; None: wait `wait_s` then ask again, or stop
    wait_s: float = 0.0
    stop: str = ""  # non-empty: give up with this reason


def next_offer(cands: tuple[Candidate, ...], refused: tuple[str, ...], now_s: float,
               arrival_s: float, p: ForwardingParams) -> Offer:
    """The next prefill to offer to, in fewest-open-streams order, skipping this sweep's refusals."""
    waited = now_s - arrival_s
    if waited >= p.ttft_deadline_s:
        return Offer(te=None, stop=f"TTFT deadline {p.ttft_deadline_s:g}s passed after "
                                    f"{len(refused)} refusals in the last sweep; no prefill accepted")
    if not cands:
        return Offer(te=None, stop="no prefill TE in the group")
    for c in sorted(cands, key=lambda c: (c.load, c.te)):
        if c.te not in refused:
            return Offer(te=c.te)
    return Offer(te=None, wait_s=min(p.retry_backoff_s, p.ttft_deadline_s - waited))
