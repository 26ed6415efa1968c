"""A transfer accepted into an empty fabric has no tick at its setup end (fabric.py,
`FabricState.lone`): its tick is armed at its completion and the next handler records the start.
Whatever comes while it is in setup or flowing (transfers, cancels, probes, link faults), every
answer comes at the same float time with the same content as with a tick at every setup end."""

from __future__ import annotations

import pytest
from dev_harness import answer_for, answers, assert_state_is_fold, make_driver, send
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.actors.ports.faults import LinkDegrade, LinkDown, LinkUp
from deepserve.actors.ports.link import LinkCancel, LinkProbe, LinkTransfer, LinkTransferDone
from deepserve.adapters.hardware.devices import fabric
from deepserve.adapters.hardware.devices.fabric import Fabric, fixed_cost_s
from deepserve.adapters.hardware.devices.topology import FABRIC
from deepserve.adapters.hardware.specs import link_spec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

GB = 10**9
A, B, C = "hw/s0/npu0", "hw/s1/npu0", "hw/s1/npu1"
_PATHS = [
    ("s0/npu0/roce:tx",), ("s0/npu0/roce:tx", "s1/npu0/roce:rx"), ("s1/npu1/roce:rx",),
    ("s0/host/pcie:h2d", "s0/npu0/pcie:h2d"), ("s0/npu0/pcie:h2d",),
]  # fmt: skip
_FIX = fixed_cost_s("roce", 1)  # 30 us: inputs land before, at and after setup ends


def _ticks(d) -> int:
    sink = d.sink
    return sum(1 for s in sink.steps if s.input.actor == FABRIC and s.input.type == "FabricTick")


def _run(inputs, lone: bool):
    with pytest.MonkeyPatch.context() as m:
        if not lone:
            m.setattr(fabric, "lone_delay_s", lambda *_: None)
        d = make_driver()
        d.spawn(FABRIC, Fabric, cluster="gen1", servers=2)
        for at, msg in inputs:
            send(d, FABRIC, msg, at=at)
        d.run()
        return d


def test_a_lone_transfer_costs_one_tick_and_the_same_floats():
    inputs = [(0.25, LinkTransfer(req_id="x", src=A, dst=B, nbytes=3 * GB, messages=4))]
    lone, stepwise = _run(inputs, True), _run(inputs, False)
    assert answers(lone) == answers(stepwise)
    assert (_ticks(lone), _ticks(stepwise)) == (1, 2)
    t, done = answer_for(lone, "x")
    assert isinstance(done, LinkTransferDone) and t == 0.25 + done.duration_s
    cap = effective_bw_bytes_per_s(link_spec("roce"))
    assert done.duration_s == pytest.approx(fixed_cost_s("roce", 4) + 3 * GB / cap, rel=1e-9)
    assert lone.actor(FABRIC).state.lone is None
    assert verify(MemoryLog(lone.sink)).identical


def _inputs(draw_list):
    out = []
    for i, (kind, slot, frac, jitter, path, nbytes) in enumerate(draw_list):
        at = 0.01 * slot + frac * _FIX + jitter  # near one setup's end: before, at, after it
        if kind == "xfer":
            out.append((at, LinkTransfer(req_id=f"x{i}", src=A, dst=B, nbytes=nbytes, path=path)))
        elif kind == "cancel":
            out.append((at, LinkCancel(req_id=f"x{max(0, i - 1)}")))
        elif kind == "probe":
            out.append((at, LinkProbe(req_id=f"p{i}", link=path[0].rpartition(":")[0])))
        elif kind == "degrade":
            out.append((at, LinkDegrade(link=path[0].rpartition(":")[0], bw_factor=0.5)))
        elif kind == "down":
            out.append((at, LinkDown(link=path[0].rpartition(":")[0])))
        else:
            out.append((at, LinkUp(link=path[0].rpartition(":")[0])))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["xfer"] * 5 + ["cancel", "probe", "degrade", "down", "up"]),
            st.integers(0, 4),
            st.sampled_from([0.0, 0.5, 1.0, 1.0 + 1e-9, 2.0]),
            st.sampled_from([0.0, 0.0, 0.0, 1e-6]) | st.floats(0.0, 5e-5),
            st.sampled_from(_PATHS),
            st.integers(0, 2 * 10**8),
        ),
        min_size=1,
        max_size=10,
    )
)
def test_answers_are_those_of_a_tick_at_every_setup_end(draws):
    inputs = _inputs(draws)
    lone, stepwise = _run(inputs, True), _run(inputs, False)
    assert answers(lone) == answers(stepwise)  # same times (floats) and same messages
    assert _ticks(lone) <= _ticks(stepwise)
    f_lone, f_step = lone.actor(FABRIC).state, stepwise.actor(FABRIC).state
    assert (f_lone.xfers, f_lone.flow, f_lone.delivered, f_lone.failed) == (
        f_step.xfers, f_step.flow, f_step.delivered, f_step.failed,
    )  # fmt: skip
    assert_state_is_fold(lone, FABRIC)
    assert verify(MemoryLog(lone.sink)).identical


def test_a_completion_no_timer_can_hit_is_ticked_stepwise():
    """At 15 us a timer cannot fire at this transfer's completion (the sum rounds half to
    even past it): its setup end is ticked, and the answer comes at the stepwise float."""
    inputs = [(1.5000000000000002e-05, LinkTransfer(req_id="x", src=A, dst=B, nbytes=20008))]
    lone, stepwise = _run(inputs, True), _run(inputs, False)
    assert answers(lone) == answers(stepwise) and _ticks(lone) == 2


def test_a_tick_at_a_lone_transfers_completion_is_the_only_one():
    """Back to back lone transfers: one tick each, none at a setup end."""
    inputs = [(0.1 + 0.1 * i, LinkTransfer(req_id=f"x{i}", src=A, dst=C, nbytes=GB)) for i in range(5)]
    d = _run(inputs, True)
    assert _ticks(d) == 5 and len(answers(d)) == 5
