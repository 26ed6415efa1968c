"""The DP master's scheduling and batch-end fold as they were written before their fast paths
(plain comprehensions, helper calls, a binary search): the reference that
test_master_fast_paths.py compares the current code with, decision by decision."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import deepserve
from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master import scheduler
from deepserve.actors.flowserve.master.evolve import (
    PREFILL_RATE_WEIGHT,
    RUN_PASS_WEIGHT,
    _before,
    _lead_tokens,
)
from deepserve.actors.flowserve.master.plan import SINGLE, Plan, Run
from deepserve.actors.flowserve.master.state import (
    RUNNING,
    BatchEnded,
    BatchPlanned,
    MasterConfig,
    MasterState,
    Req,
)
from deepserve.core import Event


def _pure_scheduler() -> ModuleType:
    """scheduler.py loaded from its source as a module of its own: in the compiled build the
    real module's `_Step` is a native class, which an interpreted class cannot subclass. Its
    Plan and Run are the real module's (the checker compares them with `==`)."""
    path = Path(deepserve.__file__).parent / "actors" / "flowserve" / "master" / "scheduler.py"
    spec = importlib.util.spec_from_file_location("master_reference_scheduler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_pure = _pure_scheduler()
_Step, _Lead = _pure._Step, _pure._Lead


def _is_decode(r: Req) -> bool:
    return r.num_tokens - r.num_computed == 1 and r.emitted > 0


def ref_run_cap(st: MasterState, cfg: MasterConfig) -> int:
    if st.run_pass_s <= 0.0:
        return min(cfg.max_run_iterations, scheduler.PROBE_RUN_PASSES)
    fit = int(scheduler.RUN_TIMEOUT_SHARE * cfg.npu_timeout_s / st.run_pass_s)
    return max(1, min(cfg.max_run_iterations, fit))


def ref_has_head(st: MasterState, entries) -> bool:  # noqa: ANN001
    reqs = st.reqs
    return any(not (e.n == 1 and _is_decode(reqs[e.task_id])) for e in entries if e.task_id in reqs)


class RefStep(_Step):
    def run_running(self) -> None:
        reqs, B, seqs = self.st.reqs, self.cfg.block_tokens, self.st.rtc.seqs
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
            sb = seqs.get(tid)
            need = -(-(r.num_computed + n) // B) - (len(sb.blocks) if sb is not None else 0)
            if not self._make_room(need, tid):
                self._preempt(tid)
                continue
            if need > 0:
                self.record(rtc.allocate(self.st.rtc, tid, need))
            self._add(tid, n)

    def passes(self) -> Run:
        st, cfg = self.st, self.cfg
        if not cfg.aggregate or not self.entries or self.preempted:
            return SINGLE
        reqs, admitted = st.reqs, dict(self.admitted)
        entries = self.entries
        if len(entries) != len(st.running) + len(admitted):
            in_batch = {e.task_id for e in entries}
            if any(t not in in_batch and reqs[t].cancelled is None for t in st.running):
                return SINGLE
        tasks = [reqs[e.task_id] for e in entries]
        c0 = [admitted.get(e.task_id, r.num_computed) for e, r in zip(entries, tasks, strict=True)]
        head = any(not (e.n == 1 and _is_decode(r) and e.task_id not in admitted)
                   for e, r in zip(entries, tasks, strict=True))  # fmt: skip
        if head and any(t not in admitted for t in st.waiting):
            return SINGLE
        after = [c + e.n for c, e in zip(c0, entries, strict=True)]
        if head and any(a < r.num_tokens for a, r in zip(after, tasks, strict=True)):
            if st.rtc.config.dram_blocks:
                return SINGLE
            lead = _Lead(entries, tasks, c0, self._run_order(admitted), cfg)
            if lead.failed:
                return SINGLE
            k = min(ref_run_cap(st, cfg), *(f + r.out_len - r.emitted for f, r in zip(lead.emit_from, tasks, strict=True)))
            k = self._blocks_allow(lead.computed, k) if k > 1 else k
            if k <= 1:
                return SINGLE
            return Run(k, tuple(lead.passes[: k - 1]), tuple(min(f, k) for f in lead.emit_from))
        k = min(ref_run_cap(st, cfg), *(r.out_len - r.emitted for r in tasks))
        if k <= 1:
            return SINGLE

        def computed(j: int) -> list[int]:
            return [a + j - 1 for a in after]

        k = self._blocks_allow(computed, k)
        return SINGLE if k <= 1 else Run(k)


def ref_schedule(st: MasterState, cfg: MasterConfig, record: Callable[[Event], None], launch: bool) -> Plan:
    step = RefStep(st, cfg, record)
    step.run_running()
    step.admit_waiting()
    if not step.entries and not step.preempted:
        return Plan(batch=None, copies=step.copies)
    run = step.passes()
    batch = BatchPlanned(
        step=st.step, entries=tuple(step.entries), iterations=run.passes, lead=run.lead,
        emit_from=run.emit_from, admitted=tuple(step.admitted), preempted=tuple(step.preempted),
        launched=launch and bool(step.entries),
    )  # fmt: skip
    return Plan(batch=batch, copies=step.copies)


def ref_ended(st: MasterState, e: BatchEnded) -> None:
    fl = st.in_flight
    st.in_flight = None
    if fl is None or e.failed:
        return
    passes = len(e.ends_s)
    m = 1 + len(fl.lead)
    if passes > m:
        sample = (e.ends_s[-1] - e.ends_s[m - 1]) / (passes - m)
        old = st.run_pass_s
        st.run_pass_s = sample if old == 0.0 else (1 - RUN_PASS_WEIGHT) * old + RUN_PASS_WEIGHT * sample
    reqs = st.reqs
    prefill = [0] * (1 + len(fl.lead))
    head = passes > 1 and ref_has_head(st, fl.entries)
    lead = _lead_tokens(fl.lead) if passes > 1 and fl.lead else {}
    for i, entry in enumerate(fl.entries):
        r = reqs.get(entry.task_id)
        if r is None or r.status != RUNNING:
            continue
        if passes > 1:
            k = passes if r.cancelled_at is None else _before(e.ends_s, r.cancelled_at)
            if k == 0:
                continue
            if not lead:
                if entry.n > 1:
                    prefill[0] += entry.n
                r.num_computed += entry.n + k - 1
                r.emitted += k
                if head and r.first_token_s is None:
                    r.first_token_s = e.ends_s[0]
                continue
            ns = (entry.n, *lead.get(entry.task_id, ()))
            ran = ns[:k]
            for j, n in enumerate(ran):
                if n > 1:
                    prefill[j] += n
            r.num_computed += sum(ran) + max(0, k - len(ns))
            f = fl.emit_from[i] if fl.emit_from else 0
            if k > f:
                r.emitted += k - f
                if head and r.first_token_s is None:
                    r.first_token_s = e.ends_s[f]
            continue
        if r.cancelled_at is not None and e.ends_s[0] >= r.cancelled_at:
            continue
        if entry.n > 1:
            prefill[0] += entry.n
        r.num_computed += entry.n
        if r.num_computed >= r.num_tokens:
            r.emitted += 1
            if r.first_token_s is None:
                r.first_token_s = e.ends_s[0]
    for tokens, s in zip(prefill, (e.prefill_s, *e.lead_s), strict=False) if fl.lead else ((prefill[0], e.prefill_s),):
        if s > 0 and tokens:
            w = PREFILL_RATE_WEIGHT
            st.prefill_tokens_per_s = (1 - w) * st.prefill_tokens_per_s + w * (tokens / s)
