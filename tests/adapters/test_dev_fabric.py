"""The fabric actor: transfer cost from transfer.py, max-min sharing from fairshare.py, exactly
once delivery with the fingerprint, and the link faults (down, degraded, flapping, up)."""

from __future__ import annotations

import pytest
from dev_harness import (
    answer_for,
    answers,
    assert_state_is_fold,
    events,
    handler_failures,
    make_driver,
    send,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from maxmin_reference import Q, simulate

from deepserve.actors.ports.faults import LinkDegrade, LinkDown, LinkFlap, LinkUp
from deepserve.actors.ports.link import (
    LinkBroadcast,
    LinkBroadcastDone,
    LinkCancel,
    LinkProbe,
    LinkStatus,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.adapters.hardware.devices.fabric import Fabric, fixed_cost_s
from deepserve.adapters.hardware.devices.flows import check_conservation
from deepserve.adapters.hardware.devices.topology import FABRIC, cloudmatrix384, gen1_cluster
from deepserve.adapters.hardware.fairshare import Flow, completion_times_s
from deepserve.adapters.hardware.specs import link_spec
from deepserve.adapters.hardware.transfer import (
    broadcast_time_s,
    effective_bw_bytes_per_s,
    transfer_time_s,
)

GB = 10**9
A, B, C = "hw/s0/npu0", "hw/s1/npu0", "hw/s1/npu1"
ROCE_TX = "s0/npu0/roce"


def _driver(servers: int = 2, cluster: str = "gen1", seed: int = 0):
    d = make_driver(seed=seed)
    d.spawn(FABRIC, Fabric, cluster=cluster, servers=servers)
    fabric = d.actor  # late-bound: the actor exists after the first delivery

    def conservation(drv) -> None:
        if drv.alive(FABRIC) and drv.cells[FABRIC].actor is not None:
            f = fabric(FABRIC)
            check_conservation(f.state, f.nominal)

    d.invariants.append(conservation)
    return d


def _xfer(req_id: str, src=A, dst=B, nbytes=GB, **kw) -> LinkTransfer:
    return LinkTransfer(req_id=req_id, src=src, dst=dst, nbytes=nbytes, **kw)


@pytest.mark.parametrize(
    ("cluster", "src", "dst", "kind"),
    [("gen1", A, B, "roce"), ("gen1", A, "hw/s0/npu5", "hccs"), ("cm384", A, B, "ub"),
     ("gen1", "hw/s0/host", A, "pcie")],
)  # fmt: skip
def test_lone_transfer_costs_what_transfer_py_says(cluster, src, dst, kind):
    d = _driver(cluster=cluster)
    send(d, FABRIC, _xfer("x", src, dst, nbytes=3 * GB, messages=16, fingerprint="kv:abc"))
    d.run()
    t, done = answer_for(d, "x")
    assert isinstance(done, LinkTransferDone)
    expected = transfer_time_s(3 * GB, link_spec(kind), messages=16)
    assert done.duration_s == pytest.approx(expected, rel=1e-12) and t == done.duration_s
    assert (done.nbytes, done.fingerprint, done.link_kind) == (3 * GB, "kv:abc", kind)
    assert_state_is_fold(d, FABRIC)


def test_flows_sharing_a_link_split_it_fairly_and_speed_up_when_one_ends():
    d = _driver()
    send(d, FABRIC, _xfer("big", A, B, nbytes=4 * GB))
    send(d, FABRIC, _xfer("small", A, C, nbytes=1 * GB))  # shares s0/npu0/roce:tx
    d.run()
    cap = effective_bw_bytes_per_s(link_spec("roce"))
    fixed = fixed_cost_s("roce", 1)
    assert answer_for(d, "small")[1].duration_s == pytest.approx(fixed + 1 * GB / (cap / 2))
    # big: 1 GB at half rate while small runs, then 3 GB alone
    assert answer_for(d, "big")[1].duration_s == pytest.approx(fixed + 2 * GB / cap + 3 * GB / cap)


def test_cancel_frees_the_bandwidth_at_once_and_answers_the_requester():
    d = _driver()
    send(d, FABRIC, _xfer("big", A, B, nbytes=4 * GB))
    send(d, FABRIC, _xfer("gone", A, C, nbytes=4 * GB))  # shares s0/npu0/roce:tx
    send(d, FABRIC, LinkCancel(req_id="gone"), at=0.1)
    send(d, FABRIC, LinkCancel(req_id="never-sent"), at=0.1)  # ignored: nothing to cancel
    d.run()
    cap = effective_bw_bytes_per_s(link_spec("roce"))
    fixed = fixed_cost_s("roce", 1)
    t, failed = answer_for(d, "gone")
    assert isinstance(failed, LinkTransferFailed) and t == 0.1 and "cancelled" in failed.reason
    # big ran at half rate until 0.1 s, then alone at full rate
    half_rate_bytes = (0.1 - fixed) * cap / 2
    expected = 0.1 + (4 * GB - half_rate_bytes) / cap
    assert answer_for(d, "big")[1].duration_s == pytest.approx(expected, rel=1e-9)
    assert d.actor(FABRIC).state.xfers == {}


# Link directions of a 2-server gen1 fabric used to build random multi-hop paths.
_RESOURCES = [
    "s0/npu0/roce:tx", "s0/npu1/roce:tx", "s1/npu0/roce:rx", "s1/npu1/roce:rx",
    "s0/hccs/0-1:0>1", "s0/host/pcie:h2d", "s0/npu0/pcie:h2d",
]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    flows=st.lists(
        st.tuples(
            st.lists(st.sampled_from(_RESOURCES), min_size=1, max_size=3, unique=True),
            st.integers(0, 5 * GB),
            st.floats(0.0, 0.5),
            st.text("abcdef0123456789", min_size=0, max_size=8),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_fair_sharing_matches_the_pure_model_and_delivers_exactly_once(flows):
    d = _driver()
    fabric_caps = None
    expected_flows = {}
    for i, (path, nbytes, at, fp) in enumerate(flows):
        send(
            d,
            FABRIC,
            _xfer(f"x{i}", nbytes=nbytes, path=tuple(path), fingerprint=fp or None),
            at=at,
        )
    d.run()
    fabric = d.actor(FABRIC)
    fabric_caps = fabric.nominal
    for i, (path, nbytes, at, _) in enumerate(flows):
        kind = fabric.links[path[0].rpartition(":")[0]].kind
        expected_flows[f"x{i}"] = Flow(
            path=tuple(path), nbytes=nbytes, start_s=at + fixed_cost_s(kind, 1)
        )
    expected = completion_times_s(fabric_caps, expected_flows)
    exact = _reference(fabric_caps, expected_flows)
    assert exact.keys() == expected.keys()
    for k, t in exact.items():  # the independent exact simulator agrees with both
        assert float(t) == pytest.approx(expected[k], rel=1e-6, abs=1e-9)
    got = answers(d)
    assert len(got) == len(flows)  # exactly once each
    assert sorted(m.req_id for _, m in got) == sorted(expected)
    for t, m in got:
        i = int(m.req_id[1:])
        assert isinstance(m, LinkTransferDone)
        assert m.nbytes == flows[i][1] and m.fingerprint == (flows[i][3] or None)
        assert t == pytest.approx(expected[m.req_id], rel=1e-6, abs=1e-9)
    st_ = fabric.state
    assert st_.xfers == {} and st_.delivered == len(flows)
    assert st_.delivered_bytes == sum(f[1] for f in flows)
    assert handler_failures(d) == []
    assert_state_is_fold(d, FABRIC)


@settings(max_examples=150, deadline=None)
@given(
    path=st.lists(st.sampled_from(_RESOURCES), min_size=1, max_size=3, unique=True),
    nbytes=st.integers(1, 10 * GB),
    f_lo=st.floats(0.05, 1.0),
    f_hi=st.floats(0.05, 1.0),
    which=st.integers(0, 2),
)
def test_more_bandwidth_never_slower(path, nbytes, f_lo, f_hi, which):
    f_lo, f_hi = min(f_lo, f_hi), max(f_lo, f_hi)
    link = path[which % len(path)].rpartition(":")[0]

    def duration(factor: float) -> float:
        d = _driver()
        send(d, FABRIC, LinkDegrade(link=link, bw_factor=factor))
        send(d, FABRIC, _xfer("x", nbytes=nbytes, path=tuple(path)), at=0.1)
        d.run()
        return answer_for(d, "x")[1].duration_s

    assert duration(f_hi) <= duration(f_lo) * (1 + 1e-12)


def test_degraded_link_is_slower_by_exactly_the_factor():
    d = _driver()
    send(d, FABRIC, _xfer("full", nbytes=2 * GB))
    send(d, FABRIC, LinkDegrade(link=ROCE_TX, bw_factor=0.25), at=1.0)
    send(d, FABRIC, _xfer("slow", nbytes=2 * GB), at=1.0)
    # degrading mid-flight: the first half at full speed, the rest at a quarter
    send(d, FABRIC, LinkUp(link=ROCE_TX), at=3.0)
    send(d, FABRIC, _xfer("mid", nbytes=2 * GB), at=3.0)
    send(
        d,
        FABRIC,
        LinkDegrade(link=ROCE_TX, bw_factor=0.5),
        at=3.0 + fixed_cost_s("roce", 1) + 1 * GB / effective_bw_bytes_per_s(link_spec("roce")),
    )
    d.run()
    fixed = fixed_cost_s("roce", 1)
    bw = 2 * GB / effective_bw_bytes_per_s(link_spec("roce"))
    assert answer_for(d, "full")[1].duration_s == pytest.approx(fixed + bw, rel=1e-12)
    assert answer_for(d, "slow")[1].duration_s - fixed == pytest.approx(4 * bw, rel=1e-9)
    assert answer_for(d, "mid")[1].duration_s - fixed == pytest.approx(bw / 2 + bw, rel=1e-9)


def test_link_down_fails_in_flight_and_new_transfers_and_frees_bandwidth():
    d = _driver()
    send(d, FABRIC, _xfer("flowing", A, B, nbytes=10 * GB))
    send(d, FABRIC, _xfer("other", "hw/s0/npu1", B, nbytes=10 * GB))  # shares B's rx
    send(d, FABRIC, _xfer("in-setup", A, C, nbytes=GB), at=0.1)
    send(d, FABRIC, LinkDown(link=ROCE_TX), at=0.1 + 1e-6)  # before in-setup's setup ends
    send(d, FABRIC, _xfer("new", A, C, nbytes=GB), at=0.2)
    send(d, FABRIC, LinkProbe(req_id="probe", link=ROCE_TX), at=0.2)
    send(d, FABRIC, LinkUp(link=ROCE_TX), at=1.0)
    send(d, FABRIC, _xfer("after", A, C, nbytes=GB), at=1.0)
    d.run()
    for req, at in (("flowing", 0.1 + 1e-6), ("in-setup", 0.1 + 1e-6), ("new", 0.2)):
        t, msg = answer_for(d, req)
        assert (
            isinstance(msg, LinkTransferFailed) and msg.link == ROCE_TX and t == pytest.approx(at)
        )
        assert ROCE_TX in msg.reason
    probe = answer_for(d, "probe")[1]
    assert isinstance(probe, LinkStatus) and not probe.up and probe.capacity_bytes_per_s == 0
    cap = effective_bw_bytes_per_s(link_spec("roce"))
    fixed = fixed_cost_s("roce", 1)
    t_down = 0.1 + 1e-6
    sent_shared = (t_down - fixed) * cap / 2
    other = answer_for(d, "other")[1]
    assert other.duration_s == pytest.approx(t_down + (10 * GB - sent_shared) / cap, rel=1e-9)
    assert isinstance(answer_for(d, "after")[1], LinkTransferDone)
    assert handler_failures(d) == []
    assert_state_is_fold(d, FABRIC)


def test_flapping_toggles_at_the_scheduled_times():
    d = _driver()
    send(d, FABRIC, LinkFlap(link=ROCE_TX, down_s=1.0, up_s=2.0, count=2), at=10.0)
    send(d, FABRIC, _xfer("during-down", nbytes=GB), at=10.5)
    send(d, FABRIC, _xfer("during-up", nbytes=GB), at=11.5)
    d.run()
    toggles = [(e.at_s, e.up) for e in events(d, FABRIC) if type(e).__name__ == "FabricLinkSet"]
    assert toggles == [(10.0, False), (11.0, True), (13.0, False), (14.0, True)]
    assert isinstance(answer_for(d, "during-down")[1], LinkTransferFailed)
    assert isinstance(answer_for(d, "during-up")[1], LinkTransferDone)  # 40 ms, before 13.0
    assert d.actor(FABRIC).state.flaps == {} and d.actor(FABRIC).state.conds == {}


def test_an_explicit_fault_ends_flapping():
    d = _driver()
    send(d, FABRIC, LinkFlap(link=ROCE_TX, down_s=1.0, up_s=1.0, count=5))
    send(d, FABRIC, LinkUp(link=ROCE_TX), at=2.5)
    d.run()
    toggles = [(e.at_s, e.up) for e in events(d, FABRIC) if type(e).__name__ == "FabricLinkSet"]
    assert toggles == [(0.0, False), (1.0, True), (2.0, False), (2.5, True)]
    assert d.now == 2.5


def test_broadcast_costs_a_pipelined_chain_and_delivers_to_every_target():
    d = _driver(servers=3)
    targets = ("hw/s1/npu0", "hw/s2/npu0")
    send(
        d, FABRIC, LinkBroadcast(req_id="b", src=A, targets=targets, nbytes=5 * GB, fingerprint="w")
    )
    d.run()
    done = answer_for(d, "b")[1]
    assert (
        isinstance(done, LinkBroadcastDone) and done.targets == targets and done.fingerprint == "w"
    )
    assert done.duration_s == pytest.approx(
        broadcast_time_s(5 * GB, link_spec("roce"), 2), rel=1e-12
    )
    assert d.actor(FABRIC).state.delivered_bytes == 10 * GB


def test_bad_requests_and_unknown_links_are_answered_not_crashed():
    d = _driver()
    send(d, FABRIC, _xfer("nowhere", A, "hw/s9/npu0"))
    send(d, FABRIC, _xfer("neg", nbytes=-1))
    send(d, FABRIC, _xfer("hccs-out", A, B, via="hccs"))
    send(d, FABRIC, _xfer("dup", nbytes=GB))
    send(d, FABRIC, _xfer("dup", nbytes=GB))
    send(d, FABRIC, _xfer("zero", nbytes=0))
    send(d, FABRIC, LinkDown(link="s7/npu0/roce"))
    send(d, FABRIC, LinkDegrade(link=ROCE_TX, bw_factor=0.0))
    d.run()
    reasons = {m.req_id: m.reason for _, m in answers(d) if isinstance(m, LinkTransferFailed)}
    assert "2 servers" in reasons["nowhere"] and reasons["neg"] == "nbytes: must be >= 0, got -1"
    assert "HCCS does not leave" in reasons["hccs-out"] and "already in flight" in reasons["dup"]
    assert answer_for(d, "zero")[1].duration_s == pytest.approx(fixed_cost_s("roce", 1))
    rejected = [e.reason for e in events(d, FABRIC) if type(e).__name__ == "FabricFaultRejected"]
    assert len(rejected) == 2 and "unknown link 's7/npu0/roce'" in rejected[0]
    assert handler_failures(d) == []


def test_topologies_route_over_the_documented_links():
    gen1 = gen1_cluster(2)
    assert len(gen1.npus()) == 16 and gen1.hosts() == ["hw/s0/host", "hw/s1/host"]
    cm = cloudmatrix384()
    assert len(cm.npus()) == 768 and cm.npu_kind == "910c"
    with pytest.raises(ValueError, match="servers: cm384 takes 1 to 48"):
        cloudmatrix384(49)

def _reference(caps, flows, changes=()):
    """Completion times from the independent exact simulator (tests/adapters/maxmin_reference)."""
    used = {r for f in flows.values() for r in f.path}
    return simulate(
        {r: Q(caps[r]) for r in used},
        {k: (f.path, Q(f.nbytes), Q(f.start_s)) for k, f in flows.items()},
        [(Q(t), r, Q(c)) for t, r, c in changes if r in used],
    )

