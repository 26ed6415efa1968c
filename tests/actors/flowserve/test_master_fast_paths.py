"""The DP master's per-batch fast paths make the decisions of their readable versions beside them
in the source (`scheduler.schedule_reference`, `scheduler.has_head_reference`,
`evolve.ended_reference`): at every scheduling call and every batch end of a run, the fast path
and the reference, each on its own copy of the state, give the same plan, the same recorded
events and the same state after them."""

from __future__ import annotations

import copy
import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fsharness import driver
from fswire import REQ, hardware, master_config, task
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import deepserve
from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master import actor as master_actor
from deepserve.actors.flowserve.master import evolve as master_evolve
from deepserve.actors.flowserve.master import scheduler
from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.master.evolve import (
    FOLDS,
    RTC_EVENT_TYPES,
    ended_reference,
    evolve_master,
)
from deepserve.actors.flowserve.master.state import MASTER_EVENTS, BatchEnded, MasterState
from deepserve.actors.flowserve.messages import CancelTask
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import run_scenario
from deepserve.core import Event

M = "te/0/dp/0"


def _pure_scheduler() -> ModuleType:
    """scheduler.py loaded from its source as a module of its own, for counting the calls of
    `_Step._blocks_allow`: in the compiled build the real `_Step` is a native class, whose
    methods cannot be patched. Its Plan and Run are the real module's (compared with `==`)."""
    path = Path(deepserve.__file__).parent / "actors" / "flowserve" / "master" / "scheduler.py"
    spec = importlib.util.spec_from_file_location("pure_master_scheduler", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_pure = _pure_scheduler()


def test_the_fold_table_covers_every_master_event_and_rtc_events_exactly() -> None:
    assert set(MASTER_EVENTS) <= set(FOLDS)
    assert not set(FOLDS) & RTC_EVENT_TYPES
    assert RTC_EVENT_TYPES == frozenset(rtc.RTC_EVENTS)
    with pytest.raises(AssertionError, match="unknown event"):
        evolve_master(MasterState(rtc=rtc.new_rtc(rtc.RtcConfig(hbm_blocks=4))), Event())


class _Checker:
    """Wraps `schedule` and the batch-end fold: each runs beside its reference."""

    def __init__(self, monkeypatch: Any) -> None:
        self.seen: Counter[str] = Counter()
        # A mismatch raises inside a handler, where the kernel supervises it (a restart):
        # each is kept here too, for the test to assert there was none.
        self.mismatches: list[str] = []
        real_schedule, real_evolve = scheduler.schedule, DpMaster.evolve
        # Counted on the reference's step (the pure source's class): the compiled `_Step`'s
        # calls to its own methods do not go through a patched attribute.
        real_blocks_allow = _pure._Step._blocks_allow

        def schedule(st: MasterState, cfg: Any, record: Any, launch: bool = False) -> Any:
            ref_st, ref_events, events = copy.deepcopy(st), [], []

            def ref_record(ev: Event) -> None:
                ref_events.append(ev)
                evolve_master(ref_st, ev)

            def rec(ev: Event) -> None:
                events.append(ev)
                record(ev)

            want = _pure.schedule_reference(ref_st, cfg, ref_record, launch)
            got = real_schedule(st, cfg, rec, launch)
            self.check(got == want and events == ref_events and st == ref_st, f"schedule at step {st.step}")
            b = got.batch
            self.seen["run" if b is not None and b.iterations > 1 else "single"] += 1
            self.seen["lead"] += bool(b is not None and b.lead)
            self.seen["preempted"] += bool(b is not None and b.preempted)
            return got

        def evolve(actor: DpMaster, state: MasterState, event: Event) -> MasterState:
            assert (type(event) in RTC_EVENT_TYPES) == rtc.is_rtc_event(event)
            if type(event) is not BatchEnded:
                return real_evolve(actor, state, event)
            ref = copy.deepcopy(state)
            head = scheduler.has_head_reference(ref, ref.in_flight.entries) if ref.in_flight is not None else None
            if ref.in_flight is not None:
                fast = scheduler.has_head(state, state.in_flight.entries)  # type: ignore[union-attr]
                self.check(fast == head, f"has_head at step {event.step}")
            ended_reference(ref, event)
            out = real_evolve(actor, state, event)
            self.check(out == ref, f"batch end at step {event.step}")
            self.seen["ended"] += 1
            return out

        def blocks_allow(step: Any, computed: Any, k: int) -> int:
            self.seen["blocks_allow"] += 1
            return real_blocks_allow(step, computed, k)

        self._patch(monkeypatch, schedule, evolve, blocks_allow)

    def check(self, same: bool, what: str) -> None:
        if not same:
            self.mismatches.append(what)
            raise AssertionError(f"fast path and reference differ: {what}")

    @staticmethod
    def _patch(monkeypatch: Any, schedule: Any, evolve: Any, blocks_allow: Any) -> None:
        monkeypatch.setattr(master_actor, "schedule", schedule)
        monkeypatch.setattr(DpMaster, "evolve", evolve)
        monkeypatch.setattr(_pure._Step, "_blocks_allow", blocks_allow)
        assert master_evolve.FOLDS is FOLDS


@pytest.mark.parametrize("dram_gb", [128, 0])
def test_a_mooncake_slice_schedules_as_the_reference(monkeypatch: Any, dram_gb: int) -> None:
    checker = _Checker(monkeypatch)
    scenario = load_scenario("mooncake-16te", ("cluster.tes=2", f"cluster.kv_dram_gb={dram_gb}"))
    result = run_scenario(scenario, requests=120)
    assert result.summary["completed"] == 120
    assert not checker.mismatches
    seen = checker.seen
    assert seen["run"] > 50 and seen["single"] > 50 and seen["ended"] > 100, seen
    if not dram_gb:
        assert seen["lead"] > 0, seen  # leads only run without the DRAM tier


def test_a_tight_pool_preempts_and_bounds_runs_as_the_reference(monkeypatch: Any) -> None:
    checker = _Checker(monkeypatch)
    d = driver(seed=5)
    hardware(d)
    d.spawn(M, DpMaster, config=master_config(aggregate=True, hbm_blocks=40, block_tokens=16,
                                               max_num_seqs=6, max_num_batched_tokens=256))  # fmt: skip
    for i in range(16):
        t = task(i, 40 + 37 * (i % 5), 20 + 90 * (i % 3), block=16)
        d.inject(M, t, at=0.02 * i + 0.007 * (i % 4), src=REQ)
    d.inject(M, CancelTask(task_id="t6"), at=0.3, src=REQ)
    d.run()
    seen = checker.seen
    assert seen["preempted"] > 0 and seen["blocks_allow"] > 0 and seen["run"] > 0, seen


tasks = st.lists(st.tuples(st.integers(1, 300), st.integers(1, 150), st.floats(0.0, 0.4)), min_size=1, max_size=12)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=tasks, hbm_blocks=st.integers(24, 96), block_tokens=st.sampled_from([8, 16]),
       max_num_seqs=st.integers(1, 8), budget=st.sampled_from([64, 128, 512]), chunked=st.booleans(),
       aggregate=st.booleans(), cancel=st.one_of(st.none(), st.tuples(st.integers(0, 11), st.floats(0.0, 0.5))),
       seed=st.integers(0, 2**16))  # fmt: skip
def test_random_pools_schedule_as_the_reference(tasks: list, hbm_blocks: int, block_tokens: int,
                                                max_num_seqs: int, budget: int, chunked: bool,
                                                aggregate: bool, cancel: Any, seed: int) -> None:  # fmt: skip
    """Random workloads on random pools (preemption, chunked prefill, runs and leads, a
    cancel): at every scheduling call and batch end, the fast path is the reference."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        checker = _Checker(monkeypatch)
        d = driver(seed=seed)
        hardware(d)
        d.spawn(M, DpMaster, config=master_config(
            aggregate=aggregate, hbm_blocks=hbm_blocks, block_tokens=block_tokens,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=budget, chunked_prefill=chunked))  # fmt: skip
        for i, (prompt, out, at) in enumerate(tasks):
            d.inject(M, task(i, prompt, out, block=block_tokens), at=at, src=REQ)
        if cancel is not None and cancel[0] < len(tasks):
            d.inject(M, CancelTask(task_id=f"t{cancel[0]}"), at=cancel[1], src=REQ)
        d.run()
    assert not checker.mismatches, checker.mismatches
    for what in ("run", "lead", "preempted", "blocks_allow"):  # what the examples reached
        if checker.seen[what]:
            event(what)
