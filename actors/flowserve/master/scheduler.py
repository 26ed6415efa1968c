"""FlowServe's scheduler for one DP group (DeepServe §4.2; the shape of vLLM v1's
`Scheduler.schedule`): continuous batching under a token budget, decode-first, chunked prefill,
prefix-cache hits at admission, preemption (recompute or swap) when blocks run out, and — for
the simulation — extension of a pure-decode batch to a run of k passes.

`schedule` decides and returns the batch; the block-table changes it needs are RTC events that it
hands to `record` in order (each is applied before the next decision reads the pool). It reads
the state, never writes it.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import (
    BatchPlanned,
    Entry,
    MasterConfig,
    MasterState,
    Req,
)
from deepserve.actors.flowserve.tokens import blocks_needed
from deepserve.core import Event

Record = Callable[[Event], None]

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
    return max(1, min(cfg.max_run_iterations, fit))


class Plan(msgspec.Struct, kw_only=True):
    batch: BatchPlanned | None
    copies: list[rtc.RtcCopyStarted]  # swap-outs started by preemption (the caller moves bytes)


def _is_decode(r: Req) -> bool:
    return r.num_tokens - r.num_computed == 1 and r.emitted > 0


class _Step:
    """One scheduling pass over the state (plain bookkeeping, discarded afterwards)."""

    def __init__(self, st: MasterState, cfg: MasterConfig, record: Record) -> None:
        self.st, self.cfg, self.record = st, cfg, record
        self.budget = cfg.max_num_batched_tokens
        self.entries: list[Entry] = []
        self.scheduled: set[str] = set()
        self.preempted: list[str] = []
        self.admitted: list[tuple[str, int]] = []
        self.copies: list[rtc.RtcCopyStarted] = []
        self.running = list(st.running)

    # ---- running tasks first (decode before partial prefills) ---------------------------
    def run_running(self) -> None:
        reqs = self.st.reqs
        order = [t for t in self.running if _is_decode(reqs[t])]
        order += [t for t in self.running if not _is_decode(reqs[t])]
        for tid in order:
            if tid in self.preempted or self.budget == 0:
                continue
            r = reqs[tid]
            if r.cancelled is not None:
                continue
            n = self._chunk(r.num_tokens - r.num_computed)
            if n == 0:
                continue
            need = blocks_needed(r.num_computed + n, self.cfg.block_tokens) - len(
                rtc.block_table(self.st.rtc, tid)
            )
            if not self._make_room(need, tid):
                self._preempt(tid)
                continue
            if need > 0:
                self.record(rtc.allocate(self.st.rtc, tid, need))
            self._add(tid, n)

    def _chunk(self, n: int) -> int:
        if n <= self.budget:
            return n
        return self.budget if self.cfg.chunked_prefill else 0

    def _add(self, tid: str, n: int) -> None:
        self.entries.append(Entry(tid, n))
        self.scheduled.add(tid)
        self.budget -= n

    def _make_room(self, need: int, tid: str, shared: tuple[int, ...] = ()) -> bool:
        """Preempt the lowest-priority running tasks (latest admitted, not yet in this batch)
        until `need` blocks fit; False when only `tid` itself is left to preempt."""
        R = self.st.rtc
        while need > 0 and not rtc.can_allocate(R, need, shared):
            victim = next(
                (t for t in reversed(self.running)
                 if t != tid and t not in self.scheduled and t not in self.preempted),
                None,
            )  # fmt: skip
            if victim is None:
                return False
            self._preempt(victim)
        return True

    def _preempt(self, tid: str) -> None:
        st = self.st
        if self.cfg.preemption == "swap" and st.rtc.config.dram_blocks > 0:
            r = st.reqs[tid]
            computed_blocks = r.num_computed // self.cfg.block_tokens
            hashes = r.task.prompt.block_hashes[:computed_blocks]
            if hashes:
                ev = rtc.cache_blocks(st.rtc, tid, hashes)
                if ev is not None:
                    self.record(ev)
                copy = rtc.copy_to_dram(st.rtc, hashes)
                if copy is not None:
                    self.record(copy)
                    self.copies.append(copy)
        if tid in st.rtc.seqs:
            self.record(rtc.free(st.rtc, tid))
        self.preempted.append(tid)

    # ---- then waiting tasks, first come first served ------------------------------------
    def admit_waiting(self) -> None:
        st, cfg = self.st, self.cfg
        if self.preempted:
            return  # vLLM: no admissions in a step that had to preempt
        live = len(self.running)
        blocked = False
        for tid in list(st.waiting):
            if live >= cfg.max_num_seqs or self.budget == 0:
                return
            r = st.reqs[tid]
            if r.cancelled is not None:
                continue
            # FCFS; past a head that does not fit, only tasks already holding their KV (received
            # or populated) may go: they hold blocks a preempted head waits for (no deadlock)
            if blocked and not rtc.block_table(st.rtc, tid):
                continue
            if self._admit(tid, r):
                live += 1
            else:
                blocked = True

    def _admit(self, tid: str, r: Req) -> bool:
        R, B = self.st.rtc, self.cfg.block_tokens
        table = rtc.block_table(R, tid)
        shared: tuple[int, ...] = ()
        computed = r.num_computed
        if not table:  # fresh or preempted: reuse the HBM-resident prefix
            m = rtc.match_by_prefix(R, r.task.prompt.block_hashes)
            usable = min(len(m.hbm_blocks), (r.num_tokens - 1) // B)  # compute >= 1 token
            shared = m.hbm_blocks[:usable]
            computed = usable * B
        n = self._chunk(r.num_tokens - computed)
        if n == 0:
            return False
        need = blocks_needed(computed + n, B) - len(table) - len(shared)
        if not rtc.can_allocate(R, max(need, 0), shared):
            return False
        if need > 0 or shared or tid not in R.seqs:
            self.record(rtc.allocate(R, tid, max(need, 0), shared=shared))
        self.admitted.append((tid, computed))
        self._add(tid, n)
        return True

    # ---- the simulation's fast path ---------------------------------------------------
    def passes(self) -> int:
        """How many passes the batch may run unchanged: a batch whose every entry decodes, or
        completes its prompt in this pass (its first pass is then the run's head), with no
        preemption and nothing left waiting (a waiting task would be admitted at the next pass),
        extends up to the first task that finishes and to what the free blocks allow (allocated
        now, so no pass of the run can run out)."""
        st, cfg = self.st, self.cfg
        if not cfg.aggregate or not self.entries or self.preempted:
            return 1
        reqs, admitted = st.reqs, dict(self.admitted)
        tasks = [reqs[e.task_id] for e in self.entries]
        # tokens each entry has computed when the batch starts (an admission's, for a new one)
        c0 = [admitted.get(e.task_id, r.num_computed) for e, r in zip(self.entries, tasks, strict=True)]
        head = False
        for e, r, c in zip(self.entries, tasks, c0, strict=True):
            if e.n == 1 and _is_decode(r) and e.task_id not in admitted:
                continue
            if c + e.n != r.num_tokens:
                return 1  # a prefill chunk that leaves more of its prompt: the next pass differs
            head = True
        # A head's prefill may have spent the token budget a waiting task needed: at the next
        # pass it would be admitted, so the batch would not run unchanged.
        if head and any(t not in admitted for t in st.waiting):
            return 1
        k = min(run_cap(st, cfg), *(r.out_len - r.emitted for r in tasks))
        if k <= 1:
            return 1
        B, R = cfg.block_tokens, st.rtc
        held = [len(rtc.block_table(R, e.task_id)) for e in self.entries]
        # after j passes an entry has computed its first pass's n tokens and one a pass since
        after = [c + e.n - 1 for e, c in zip(self.entries, c0, strict=True)]

        def extra(j: int) -> int:
            return sum(max(0, blocks_needed(a + j, B) - h) for a, h in zip(after, held, strict=True))

        free = rtc.hbm_free_blocks(R)
        lo, hi = 1, k  # extra(1) == 0: the first pass's blocks are allocated
        if extra(k) <= free:  # the common case: blocks do not bound the run
            lo = k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid - 1
        for e, a, h in zip(self.entries, after, held, strict=True):
            more = blocks_needed(a + lo, B) - h
            if more > 0:
                self.record(rtc.allocate(R, e.task_id, more))
        return lo


def has_head(st: MasterState, entries: tuple[Entry, ...] | list[Entry]) -> bool:
    """Whether a run of these entries starts with a pass of its own (an entry completes its
    prompt in it) rather than a decode pass like the rest."""
    reqs = st.reqs
    return any(not (e.n == 1 and _is_decode(reqs[e.task_id])) for e in entries if e.task_id in reqs)


def schedule(st: MasterState, cfg: MasterConfig, record: Record) -> Plan:
    """The next batch of this DP group, or `Plan(batch=None)` when nothing can run."""
    step = _Step(st, cfg, record)
    step.run_running()
    step.admit_waiting()
    if not step.entries and not step.preempted:
        return Plan(batch=None, copies=step.copies)
    iterations = step.passes()
    batch = BatchPlanned(
        step=st.step, entries=tuple(step.entries), iterations=iterations,
        admitted=tuple(step.admitted), preempted=tuple(step.preempted),
    )  # fmt: skip
    return Plan(batch=batch, copies=step.copies)
