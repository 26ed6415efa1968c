"""FlowServe's scheduler for one DP group (DeepServe §4.2; the shape of vLLM v1's
`Scheduler.schedule`): continuous batching under a token budget, decode-first, chunked prefill,
prefix-cache hits at admission, preemption (recompute or swap) when blocks run out, and — for
the simulation — extension of a pure-decode batch to a run of k passes.

`schedule` decides and returns the batch; the block-table changes it needs are RTC events that it
hands to `record` in order (each is applied before the next decision reads the pool). It reads
the state, never writes it.

Two versions of the same decisions live here. `schedule` is the one the master calls, once a
batch: its per-task loops have their helpers inlined (`run_running`, `passes`, `has_head`),
because a batch's fixed costs dominate. `schedule_reference` (`run_running_reference`,
`passes_reference`, `has_head_reference`, `run_cap_reference`) is how they were written before:
plain comprehensions, helper calls, a binary search. Read it first; it is never called on a hot
path. tests/actors/flowserve/test_master_fast_paths.py runs both at every scheduling call of
whole runs and checks the same plan, the same recorded events and the same state. Change both.
A run's cap, head and lead passes are runs.py's.
"""

from __future__ import annotations

from collections.abc import Callable

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.plan import SINGLE, Plan, Run
from deepserve.actors.flowserve.master.runs import (  # noqa: F401 (re-exported: evolve, the tests)
    PROBE_RUN_PASSES,
    RUN_TIMEOUT_SHARE,
    _is_decode,
    _Lead,
    has_head,
    has_head_reference,
    run_cap,
    run_cap_reference,
)
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


class _Step:
    """One scheduling pass over the state (plain bookkeeping, discarded afterwards)."""

    __slots__ = ("admitted", "after", "budget", "cfg", "copies", "entries", "head", "preempted",
                 "record", "running", "st", "tasks")  # fmt: skip

    def __init__(self, st: MasterState, cfg: MasterConfig, record: Record) -> None:
        self.st, self.cfg, self.record = st, cfg, record
        self.budget = cfg.max_num_batched_tokens
        self.entries: list[Entry] = []
        self.preempted: list[str] = []
        self.admitted: list[tuple[str, int]] = []
        self.copies: list[rtc.RtcCopyStarted] = []
        self.running = st.running  # read only: recording RTC events leaves the queues alone
        # Beside `entries`, for `passes`: each entry's task and its tokens computed after this
        # pass, and whether any entry is more than one decode token (a head).
        self.tasks: list[Req] = []
        self.after: list[int] = []
        self.head = False

    # ---- running tasks first (decode before partial prefills) ---------------------------
    def run_running(self) -> None:
        """Decodes first, then partial prefills, each in running order. Per-batch fixed costs
        dominate (2-3 entries a batch), so the per-task helpers (a decode test, `_chunk`, `_add`,
        `Req.num_tokens`) are inlined here."""
        reqs, B, seqs = self.st.reqs, self.cfg.block_tokens, self.st.rtc.seqs
        decodes: list[tuple[str, Req, int]] = []
        others: list[tuple[str, Req, int]] = []
        for t in self.running:
            r = reqs[t]
            left = r.task.prompt.num_tokens + r.emitted - r.num_computed  # tokens without KV
            (decodes if left == 1 and r.emitted > 0 else others).append((t, r, left))
        chunked = self.cfg.chunked_prefill
        entries, tasks, after = self.entries, self.tasks, self.after
        for order, decode in ((decodes, True), (others, False)):
            for tid, r, left in order:
                budget = self.budget
                if budget == 0 or (self.preempted and tid in self.preempted):
                    continue
                if r.cancelled is not None:
                    continue
                n = left if left <= budget else (budget if chunked else 0)
                if n == 0:
                    continue
                c = r.num_computed + n
                sb = seqs.get(tid)  # blocks_needed(c, B) - len(block_table), inlined
                need = -(-c // B) - (len(sb.blocks) if sb is not None else 0)
                if need > 0:
                    if not self._make_room(need, tid):
                        self._preempt(tid)
                        continue
                    self.record(rtc.allocate(self.st.rtc, tid, need))
                entries.append(Entry(tid, n))
                self.budget = budget - n
                tasks.append(r)
                after.append(c)
                if not decode:  # a decode's n is 1 (the budget is not 0)
                    self.head = True

    def _chunk(self, n: int) -> int:
        if n <= self.budget:
            return n
        return self.budget if self.cfg.chunked_prefill else 0

    def _add(self, tid: str, n: int) -> None:
        self.entries.append(Entry(tid, n))
        self.budget -= n

    def _make_room(self, need: int, tid: str, shared: tuple[int, ...] = ()) -> bool:
        """Preempt the lowest-priority running tasks (latest admitted, not yet in this batch)
        until `need` blocks fit; False when only `tid` itself is left to preempt."""
        R = self.st.rtc
        while need > 0 and not rtc.can_allocate(R, need, shared):
            scheduled = {e.task_id for e in self.entries}  # (only when blocks run short)
            victim = next(
                (t for t in reversed(self.running)
                 if t != tid and t not in scheduled and t not in self.preempted),
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
        if self.preempted or not st.waiting:
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
        need = -(-(computed + n) // B) - len(table) - len(shared)  # blocks_needed, inlined
        if not rtc.can_allocate(R, max(need, 0), shared):
            return False
        if need > 0 or shared or tid not in R.seqs:
            self.record(rtc.allocate(R, tid, max(need, 0), shared=shared))
        self.admitted.append((tid, computed))
        self._add(tid, n)
        self.tasks.append(r)
        self.after.append(computed + n)
        self.head = True  # a new task's pass computes its prompt (or a chunk of it)
        return True

    # ---- the simulation's fast path ---------------------------------------------------
    def passes(self) -> Run:
        """How many passes the batch may run unchanged, and how: a batch with no preemption and
        nothing left waiting (a waiting task would be admitted at a later pass) whose every
        running task is in it runs pass 0, then the passes that finish its prompts (the lead:
        the chunks the stepwise path would schedule, with every decode in each), then decodes,
        up to the first task that finishes and to what the free blocks allow (allocated now, so
        no pass of the run can run out)."""
        st, cfg = self.st, self.cfg
        if not cfg.aggregate or not self.entries or self.preempted:
            return SINGLE
        reqs, entries, tasks, after = st.reqs, self.entries, self.tasks, self.after
        admitted = dict(self.admitted) if self.admitted else {}
        if len(entries) != len(st.running) + len(admitted):
            in_batch = {e.task_id for e in entries}
            if any(t not in in_batch and reqs[t].cancelled is None for t in st.running):
                return SINGLE  # left out of pass 0 (no budget): a later pass would take it
        if self.head:  # an entry is an admission or more than one decode token
            # A head's prefill may have spent the token budget a waiting task needed: at the
            # next pass it would be admitted, so the batch would not run unchanged.
            for t in st.waiting:
                if t not in admitted:
                    return SINGLE
            for i, r in enumerate(tasks):  # (zip(strict=True) parses its keyword: ~1k instructions)
                if after[i] < r.task.prompt.num_tokens + r.emitted:  # a prompt is left after pass 0
                    return self._lead_run(admitted)
        k = run_cap(st, cfg)
        for r in tasks:
            left = r.out_len - r.emitted
            if left < k:
                k = left
        if k <= 1:
            return SINGLE
        k = self._decode_blocks(k)
        return SINGLE if k <= 1 else Run(k)

    def _lead_run(self, admitted: dict[str, int]) -> Run:
        """`passes` for a batch whose prompts need passes after pass 0 (the lead)."""
        st, cfg, entries, tasks = self.st, self.cfg, self.entries, self.tasks
        if st.rtc.config.dram_blocks:
            # The DRAM tier's swap-out and prefetch are planned after each batch: stepwise
            # after every chunk, in a run only at its end, and a lead would move them
            # (docs/decisions.md, "A run takes a head and a lead").
            return SINGLE
        c0 = [a - e.n for a, e in zip(self.after, entries, strict=True)]  # computed before pass 0
        lead = _Lead(entries, tasks, c0, self._run_order(admitted), cfg)  # prompts left
        if lead.failed:
            return SINGLE
        k = min(run_cap(st, cfg), *(f + r.out_len - r.emitted for f, r in zip(lead.emit_from, tasks, strict=True)))
        k = self._blocks_allow(lead.computed, k) if k > 1 else k
        if k <= 1:
            return SINGLE
        return Run(k, tuple(lead.passes[: k - 1]), tuple(min(f, k) for f in lead.emit_from))

    def _decode_blocks(self, k: int) -> int:
        """`_blocks_allow` for a run whose every pass after pass 0 decodes: the common case
        (the blocks of k passes fit) in one loop, the binary search otherwise."""
        B, R = self.cfg.block_tokens, self.st.rtc
        seqs, entries, after = R.seqs, self.entries, self.after
        extra = 0
        more: list[int] = []
        for i, e in enumerate(entries):  # entries and after are parallel lists
            sb = seqs.get(e.task_id)
            m = -(-(after[i] + k - 1) // B) - (len(sb.blocks) if sb is not None else 0)
            more.append(m)
            if m > 0:
                extra += m
        if extra > rtc.hbm_free_blocks(R):

            def computed(j: int) -> list[int]:  # every pass after pass 0 decodes
                return [a + j - 1 for a in after]

            return self._blocks_allow(computed, k)
        for i, m in enumerate(more):
            if m > 0:
                self.record(rtc.allocate(R, entries[i].task_id, m))
        return k

    def _run_order(self, admitted: dict[str, int]) -> list[int]:
        """Entry indices in the stepwise path's order of later passes: the running queue's
        order, this pass's admissions last (`evolve` appends them)."""
        pos = {t: i for i, t in enumerate(self.st.running)}
        base = len(pos)
        order = [(pos[e.task_id] if e.task_id in pos else base + i, i) for i, e in enumerate(self.entries)]
        return [i for _, i in sorted(order)]

    def _blocks_allow(self, computed: Callable[[int], list[int]], k: int) -> int:
        """The most passes (<= k) whose blocks fit in the free pool; allocates them."""
        B, R = self.cfg.block_tokens, self.st.rtc
        held = [len(rtc.block_table(R, e.task_id)) for e in self.entries]

        def extra(j: int) -> int:  # blocks_needed(c, B) inlined: B is validated (MasterConfig)
            return sum(max(0, -(-c // B) - h) for c, h in zip(computed(j), held, strict=True))

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
        for e, c, h in zip(self.entries, computed(lo), held, strict=True):
            more = -(-c // B) - h
            if more > 0:
                self.record(rtc.allocate(R, e.task_id, more))
        return lo

    # ---- the readable reference (the module's docstring) ---------------------------------
    def run_running_reference(self) -> None:
        """`run_running`: decodes first, then partial prefills, each in running order."""
        reqs, R = self.st.reqs, self.st.rtc
        decode = [_is_decode(reqs[t]) for t in self.running]
        order = [t for t, d in zip(self.running, decode, strict=True) if d]
        order += [t for t, d in zip(self.running, decode, strict=True) if not d]
        for tid in order:
            if tid in self.preempted or self.budget == 0:
                continue
            r = reqs[tid]
            if r.cancelled is not None:
                continue
            n = self._chunk(r.num_tokens - r.num_computed)
            if n == 0:
                continue
            need = blocks_needed(r.num_computed + n, self.cfg.block_tokens) - len(rtc.block_table(R, tid))
            if not self._make_room(need, tid):
                self._preempt(tid)
                continue
            if need > 0:
                self.record(rtc.allocate(R, tid, need))
            self._add(tid, n)

    def passes_reference(self) -> Run:
        """`passes`: pass 0, then the lead's passes, then decodes, while the batch stays as it is."""
        st, cfg = self.st, self.cfg
        if not cfg.aggregate or not self.entries or self.preempted:
            return SINGLE
        reqs, admitted, entries = st.reqs, dict(self.admitted), self.entries
        if len(entries) != len(st.running) + len(admitted):
            in_batch = {e.task_id for e in entries}
            if any(t not in in_batch and reqs[t].cancelled is None for t in st.running):
                return SINGLE  # left out of pass 0 (no budget): a later pass would take it
        tasks = [reqs[e.task_id] for e in entries]
        c0 = [admitted.get(e.task_id, r.num_computed) for e, r in zip(entries, tasks, strict=True)]
        head = any(not (e.n == 1 and _is_decode(r) and e.task_id not in admitted)
                   for e, r in zip(entries, tasks, strict=True))  # fmt: skip
        if head and any(t not in admitted for t in st.waiting):
            return SINGLE  # a waiting task would be admitted at the next pass
        after = [c + e.n for c, e in zip(c0, entries, strict=True)]
        if head and any(a < r.num_tokens for a, r in zip(after, tasks, strict=True)):
            if st.rtc.config.dram_blocks:
                return SINGLE  # the DRAM tier's plans would move (`_lead_run`)
            lead = _Lead(entries, tasks, c0, self._run_order(admitted), cfg)
            if lead.failed:
                return SINGLE
            k = min(run_cap_reference(st, cfg),
                    *(f + r.out_len - r.emitted for f, r in zip(lead.emit_from, tasks, strict=True)))
            k = self._blocks_allow(lead.computed, k) if k > 1 else k
            if k <= 1:
                return SINGLE
            return Run(k, tuple(lead.passes[: k - 1]), tuple(min(f, k) for f in lead.emit_from))
        k = min(run_cap_reference(st, cfg), *(r.out_len - r.emitted for r in tasks))
        if k <= 1:
            return SINGLE

        def computed(j: int) -> list[int]:  # every pass after pass 0 decodes
            return [a + j - 1 for a in after]

        k = self._blocks_allow(computed, k)
        return SINGLE if k <= 1 else Run(k)


def schedule(st: MasterState, cfg: MasterConfig, record: Record, launch: bool = False) -> Plan:
    """The next batch of this DP group, or `Plan(batch=None)` when nothing can run. With
    `launch`, a batch with entries says it is handed to the NPU at once (`launched`)."""
    step = _Step(st, cfg, record)
    step.run_running()
    step.admit_waiting()
    if not step.entries and not step.preempted:
        return Plan(batch=None, copies=step.copies)
    run = step.passes()
    batch = BatchPlanned(
        step=st.step, entries=tuple(step.entries), iterations=run.passes, lead=run.lead,
        emit_from=run.emit_from,
        admitted=tuple(step.admitted), preempted=tuple(step.preempted),
        launched=launch and bool(step.entries),
    )  # fmt: skip
    return Plan(batch=batch, copies=step.copies)


def schedule_reference(st: MasterState, cfg: MasterConfig, record: Record, launch: bool = False) -> Plan:
    """`schedule`, readable (the module's docstring)."""
    step = _Step(st, cfg, record)
    step.run_running_reference()
    step.admit_waiting()
    if not step.entries and not step.preempted:
        return Plan(batch=None, copies=step.copies)
    run = step.passes_reference()
    batch = BatchPlanned(
        step=st.step, entries=tuple(step.entries), iterations=run.passes, lead=run.lead,
        emit_from=run.emit_from, admitted=tuple(step.admitted), preempted=tuple(step.preempted),
        launched=launch and bool(step.entries),
    )  # fmt: skip
    return Plan(batch=batch, copies=step.copies)
