"""A batch's aggregated run on the NPU (the simulation's fast path, scheduler.py): how many
passes one run may take (`run_cap`), whether it starts with a pass of its own (`has_head`), and
the lead passes that finish its prompts before every pass decodes (`_Lead`). Split from
scheduler.py by concept; compiled with it (compiled.py's "master" group). As there, each fast
path keeps its readable version beside it (`run_cap_reference`, `has_head_reference`), and
tests/actors/flowserve/test_master_fast_paths.py holds them to each other.
"""

from __future__ import annotations

from deepserve.actors.flowserve.master.state import Entry, MasterConfig, MasterState, Req

# A run's expected length stays under this share of the NPU ask timeout, so a healthy NPU always
# answers a run in time (a hung one is still found after the timeout); before any run was
# timed, a run takes at most PROBE_RUN_PASSES passes (and teaches the master the pass time).
RUN_TIMEOUT_SHARE = 0.25
PROBE_RUN_PASSES = 16


def run_cap(st: MasterState, cfg: MasterConfig) -> int:
    """The most passes one aggregated run may take (>= 1)."""
    if st.run_pass_s <= 0.0:
        return min(cfg.max_run_iterations, PROBE_RUN_PASSES)
    fit = int(RUN_TIMEOUT_SHARE * cfg.npu_timeout_s / st.run_pass_s)
    cap = cfg.max_run_iterations
    if fit < cap:
        cap = fit
    return cap if cap > 1 else 1  # max(1, min(cap, fit)), once a batch


class _Lead:
    """The passes after pass 0 that finish the batch's prompts, as the stepwise scheduler
    would plan them (`run_running`: decodes first, then partial prefills in running order,
    each chunk within the token budget), and each entry's tokens computed after j passes."""

    def __init__(self, entries: list[Entry], tasks: list[Req], c0: list[int], order: list[int],
                 cfg: MasterConfig) -> None:  # fmt: skip
        comp = [c + e.n for c, e in zip(c0, entries, strict=True)]  # after pass 0
        toks = [r.num_tokens for r in tasks]
        emit_from = [0 if c >= t else -1 for c, t in zip(comp, toks, strict=True)]
        toks = [t + 1 if c >= t else t for c, t in zip(comp, toks, strict=True)]
        self.cum: list[list[int]] = [list(c0), list(comp)]  # computed after 0, 1, ... passes
        self.passes: list[tuple[Entry, ...]] = []
        self.failed = False
        cap = cfg.max_run_iterations
        while -1 in emit_from and len(self.passes) + 1 < cap:
            budget = cfg.max_num_batched_tokens
            chosen: list[tuple[int, int]] = []
            decodes = [i for i in order if emit_from[i] >= 0]
            if len(decodes) >= budget:
                self.failed = True  # a decode left out of a pass: not a run's shape
                return
            for i in decodes:
                chosen.append((i, 1))
            budget -= len(decodes)
            for i in (i for i in order if emit_from[i] < 0):
                if budget == 0:
                    break
                rem = toks[i] - comp[i]
                n = rem if rem <= budget else (budget if cfg.chunked_prefill else 0)
                if n:
                    chosen.append((i, n))
                    budget -= n
            if len(chosen) == len(decodes):
                self.failed = True  # no prompt moves on (a chunk over the budget): not a run
                return
            j = len(self.passes) + 1
            for i, n in chosen:
                comp[i] += n
                if comp[i] >= toks[i]:
                    if emit_from[i] < 0:
                        emit_from[i] = j
                    toks[i] += 1
            self.passes.append(tuple(Entry(entries[i].task_id, n) for i, n in chosen))
            self.cum.append(list(comp))
        self.emit_from = [f if f >= 0 else cap for f in emit_from]

    def computed(self, j: int) -> list[int]:
        """Tokens each entry has computed after j passes (every pass past the lead decodes)."""
        cum = self.cum
        if j < len(cum):
            return cum[j]
        extra = j - (len(cum) - 1)
        return [c + extra for c in cum[-1]]


def _is_decode(r: Req) -> bool:
    return r.num_tokens - r.num_computed == 1 and r.emitted > 0


def run_cap_reference(st: MasterState, cfg: MasterConfig) -> int:
    """`run_cap`, readable."""
    if st.run_pass_s <= 0.0:
        return min(cfg.max_run_iterations, PROBE_RUN_PASSES)
    fit = int(RUN_TIMEOUT_SHARE * cfg.npu_timeout_s / st.run_pass_s)
    return max(1, min(cfg.max_run_iterations, fit))


def has_head_reference(st: MasterState, entries: tuple[Entry, ...] | list[Entry]) -> bool:
    """`has_head`, readable."""
    reqs = st.reqs
    return any(not (e.n == 1 and _is_decode(reqs[e.task_id])) for e in entries if e.task_id in reqs)


def has_head(st: MasterState, entries: tuple[Entry, ...] | list[Entry]) -> bool:
    """Whether a run of these entries starts with a pass of its own (an entry completes its
    prompt in it) rather than a decode pass like the rest."""
    reqs = st.reqs
    for e in entries:  # any(not (e.n == 1 and r is decoding)), as a plain loop: once a batch
        r = reqs.get(e.task_id)
        if r is not None and (e.n != 1 or r.emitted <= 0 or r.task.prompt.num_tokens + r.emitted - r.num_computed != 1):
            return True
    return False
