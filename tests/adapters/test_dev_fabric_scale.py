"""The fabric at scale and at any time: answers at large virtual times (against the exact
reference simulator), and a busy fabric's log replays identically whatever the hash seed."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dev_harness import (
    answer_for,
    answers,
    assert_state_is_fold,
    handler_failures,
    log_encoding,
    send,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dev_fabric import _RESOURCES, GB, A, B, _driver, _reference, _xfer

from deepserve.actors.ports.faults import LinkDegrade
from deepserve.actors.ports.link import LinkTransferDone
from deepserve.adapters.hardware.devices.fabric import Fabric, fixed_cost_s
from deepserve.adapters.hardware.devices.flows import check_conservation
from deepserve.adapters.hardware.devices.topology import FABRIC
from deepserve.adapters.hardware.fairshare import Flow
from deepserve.adapters.hardware.specs import link_spec
from deepserve.adapters.hardware.transfer import transfer_time_s
from deepserve.benchmarks.devices import Go, KeepBusy
from deepserve.core import MemorySink, SimDriver
from deepserve.core.codec import decode, encode
from deepserve.persistence import MemoryLog
from deepserve.replay.verifier import verify


@pytest.mark.parametrize("at", [1e8, 3e7, 1e11])
def test_a_lone_transfer_completes_and_answers_at_any_virtual_time(at):
    """At t = 1e8 s one ulp of the clock is 15 ns: a completion tick lands a rounding step
    before the finish, and a fixed 1 ns tolerance said "not yet" with no timer left."""
    d = _driver()
    send(d, FABRIC, _xfer("x", A, B, nbytes=GB), at=at)
    d.run()
    t, done = answer_for(d, "x")
    assert isinstance(done, LinkTransferDone)
    expected = transfer_time_s(GB, link_spec("roce"))
    assert done.duration_s == pytest.approx(expected, abs=16 * math.ulp(at))
    assert t == at + done.duration_s and d.actor(FABRIC).state.xfers == {}
    assert_state_is_fold(d, FABRIC)


@settings(max_examples=60, deadline=None)
@given(
    base=st.floats(1e6, 1e10),
    flows=st.lists(
        st.tuples(
            st.lists(st.sampled_from(_RESOURCES), min_size=1, max_size=3, unique=True),
            st.integers(0, 5 * GB),
            st.floats(0.0, 0.5),
        ),
        min_size=1,
        max_size=6,
    ),
    degrade=st.tuples(st.sampled_from(_RESOURCES), st.floats(0.05, 1.0), st.floats(0.0, 1.0)),
)
def test_every_transfer_is_answered_once_at_large_times_as_the_exact_simulator_says(
    base, flows, degrade
):
    d = _driver()
    for i, (path, nbytes, at) in enumerate(flows):
        send(d, FABRIC, _xfer(f"x{i}", nbytes=nbytes, path=tuple(path)), at=base + at)
    link, factor, when = degrade[0].rpartition(":")[0], degrade[1], degrade[2]
    send(d, FABRIC, LinkDegrade(link=link, bw_factor=factor), at=base + when)
    d.run()
    got = answers(d)
    assert sorted(m.req_id for _, m in got) == sorted(f"x{i}" for i in range(len(flows)))
    assert all(isinstance(m, LinkTransferDone) for _, m in got)
    fabric = d.actor(FABRIC)
    ref_flows = {}
    for i, (path, nbytes, at) in enumerate(flows):
        kind = fabric.links[path[0].rpartition(":")[0]].kind
        start = (base + at) + fixed_cost_s(kind, 1) - base  # the fabric's float start, rebased
        ref_flows[f"x{i}"] = Flow(path=tuple(path), nbytes=nbytes, start_s=start)
    changes = [
        ((base + when) - base, r, fabric.nominal[r] * factor)
        for r in fabric.directions[link]
    ]
    exact = _reference(fabric.nominal, ref_flows, changes)
    # the clock's resolution at `base` bounds how closely times can agree
    slack = 64 * math.ulp(base + 10)
    for t, m in got:
        assert t - base == pytest.approx(float(exact[m.req_id]), rel=1e-6, abs=slack)
    assert fabric.state.xfers == {} and fabric.state.due == []
    assert handler_failures(d) == []


def _busy_log(flows: int, deliveries: int) -> SimDriver:
    """A client keeps `flows` UB transfers in flight on a whole CloudMatrix384: thousands of
    fabric events, so the kernel snapshots the (in-place updated) fabric state several times."""
    d = SimDriver(seed=3, sink=MemorySink())
    d.spawn(FABRIC, Fabric, cluster="cm384", servers=48)
    d.spawn("bench/client", KeepBusy)
    d.inject("bench/client", Go(flows), src="ext/bench")
    d.run(max_deliveries=2)
    while d.actor("bench/client").state < deliveries:
        d.run(max_deliveries=500)
    return d


def test_a_busy_fabric_log_replays_identically_and_its_state_is_the_fold():
    d = _busy_log(150, 700)
    result = verify(MemoryLog(d.sink))
    assert result.identical, result.summary()
    assert sum(1 for s in d.sink.steps if s.snapshot and s.input.actor == FABRIC) >= 2
    assert_state_is_fold(d, FABRIC)
    check_conservation(d.actor(FABRIC).state, d.actor(FABRIC).nominal)


def test_the_fabric_snapshots_copied_from_the_live_state_are_the_fold():
    """The fabric opts out of re-folding events into snapshots (`snapshot_from_live`): each
    periodic snapshot in the log must still equal the fold of its events up to that step."""
    d = _busy_log(150, 700)
    fabric = d.actor(FABRIC)
    state, checked = fabric.initial_state(), 0
    for step in d.sink.steps:
        if step.input.actor != FABRIC:
            continue
        for e in step.events:
            event = decode(e.type, e.payload)
            if not event.system:
                state = fabric.evolve(state, event)
        if step.snapshot is not None:
            assert step.snapshot.payload == encode(state)
            checked += 1
    assert Fabric.snapshot_from_live and checked >= 2


def test_the_fabric_log_does_not_depend_on_the_process_hash_seed():
    """Rates are float sums: their order must not come from set iteration (str hashes are
    salted per process)."""
    code = (
        "import sys; sys.path.insert(0, 'tests/adapters');"
        "from test_dev_fabric_scale import _digest; print(_digest())"
    )
    root = Path(__file__).resolve().parents[2]
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    other = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONHASHSEED": seed},
    ).stdout.strip()  # fmt: skip
    assert other == _digest() and len(other) == 64


def _digest() -> str:
    return hashlib.sha256(repr(log_encoding(_busy_log(80, 250))).encode()).hexdigest()
