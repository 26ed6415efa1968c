"""Shared SSD reads on the host actor: concurrent misses of one file read it from SSD once (a
page cache), joiners wait on that read, a load after it is a DRAM hit, a failed read fails its
joiners; on for hosts `spawn_topology` starts, off for a Host spawned without the argument (an
old log's Started record)."""

from __future__ import annotations

import pytest
from dev_harness import answer_for, assert_state_is_fold, make_driver, send

from deepserve.actors.ports.faults import LinkDown
from deepserve.actors.ports.host import HostLoad, HostLoadDone, HostLoadFailed, HostPreload
from deepserve.adapters.hardware.devices.fabric import Fabric
from deepserve.adapters.hardware.devices.host import Host
from deepserve.adapters.hardware.devices.topology import FABRIC, gen1_cluster, npu_addr
from deepserve.adapters.hardware.loading import TENSOR_INIT_S, local_load
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import server_spec
from deepserve.core import MemorySink, decode
from deepserve.core.messages import Started

HOST = "hw/s0/host"
MODEL = "llama3-8b"
SERVER = server_spec("gen1-910b")
RTOL = 1e-9  # the fabric and loading.local_load price one transfer alike, up to float rounding


def _driver(shared_reads: bool):
    d = make_driver()
    d.spawn(FABRIC, Fabric, cluster="gen1", servers=1)
    d.spawn(HOST, Host, server=0, shared_reads=shared_reads)
    return d


def _eight_tp1_misses(shared_reads: bool):
    d = _driver(shared_reads)
    for i in range(8):
        send(d, HOST, HostLoad(req_id=f"te{i}", model=MODEL, targets=(npu_addr(0, i),)))
    d.run()
    return d, [answer_for(d, f"te{i}")[1] for i in range(8)]


def test_eight_concurrent_misses_take_one_ssd_read_not_eight():
    m = model_profile(MODEL)
    one_miss = local_load(m, SERVER, 1, dram_hit=False).seconds
    eight_reads = local_load(m, SERVER, 1, dram_hit=False, loaders=8).seconds
    d, done = _eight_tp1_misses(shared_reads=True)
    assert all(isinstance(x, HostLoadDone) for x in done)
    assert sorted(x.path for x in done) == ["ssd", *["ssd-shared"] * 7]
    for x in done:  # the joiners' DRAM -> NPU copies end before the one read does
        assert x.duration_s == pytest.approx(one_miss, rel=RTOL)
    st = d.actor(HOST).state
    assert st.misses == 8 and st.jobs == {} and [c.model for c in st.cache] == [MODEL]
    assert_state_is_fold(d, HOST)
    # Without shared reads (an old log's hosts) the eight misses read the file eight times.
    _, old = _eight_tp1_misses(shared_reads=False)
    assert [x.path for x in old] == ["ssd"] * 8
    for x in old:
        assert x.duration_s == pytest.approx(eight_reads, rel=RTOL)
    assert eight_reads > 7 * one_miss


def test_a_late_joiner_ends_with_the_read_and_a_load_after_it_hits_dram():
    d = _driver(shared_reads=True)
    send(d, HOST, HostLoad(req_id="first", model=MODEL, targets=(npu_addr(0, 0),)))
    send(d, HOST, HostLoad(req_id="late", model=MODEL, targets=(npu_addr(0, 1),)), at=1.0)
    send(d, HOST, HostPreload(req_id="pre", model=MODEL), at=1.5)
    send(d, HOST, HostLoad(req_id="after", model=MODEL, targets=(npu_addr(0, 2),)), at=10.0)
    d.run()
    (t_first, first), (t_late, late) = answer_for(d, "first"), answer_for(d, "late")
    t_pre, pre = answer_for(d, "pre")
    assert first.path == "ssd" and late.path == "ssd-shared"
    assert t_late == pytest.approx(t_first, rel=RTOL)  # it waited for the read it joined
    assert late.duration_s == pytest.approx(first.duration_s - 1.0, rel=RTOL)
    # a pre-load joins too: it ends when the read does (no tensor initialisation)
    assert not pre.hit and t_pre == pytest.approx(t_first - TENSOR_INIT_S, rel=RTOL)
    after = answer_for(d, "after")[1]
    hit = local_load(model_profile(MODEL), SERVER, 1, dram_hit=True).seconds
    assert after.path == "dram-hit" and after.duration_s == pytest.approx(hit, rel=RTOL)
    assert d.actor(HOST).state.hits == 1
    assert_state_is_fold(d, HOST)


def test_a_failed_read_fails_the_loads_that_joined_it():
    d = _driver(shared_reads=True)
    send(d, HOST, HostLoad(req_id="first", model=MODEL, targets=(npu_addr(0, 0),)))
    send(d, HOST, HostLoad(req_id="joiner", model=MODEL, targets=(npu_addr(0, 1),)), at=0.5)
    send(d, FABRIC, LinkDown(link="s0/ssd"), at=1.0)
    d.run()
    (t1, first), (t2, joiner) = answer_for(d, "first"), answer_for(d, "joiner")
    assert isinstance(first, HostLoadFailed) and isinstance(joiner, HostLoadFailed)
    assert t1 == t2 == 1.0
    assert "the SSD read it joined (first)" in joiner.reason and "s0/ssd" in joiner.reason
    st = d.actor(HOST).state
    assert st.jobs == {} and st.loads_failed == 2 and st.cache == ()
    assert d.actor(FABRIC).state.xfers == {}  # the joiner's DRAM -> NPU copy was cancelled too
    assert_state_is_fold(d, HOST)


def test_new_hosts_record_shared_reads_in_their_started_record():
    d = make_driver(gen1_cluster(1))
    d.run()
    sink = d.sink
    assert isinstance(sink, MemorySink)
    started = [
        decode(s.input.type, s.input.payload) for s in sink.steps
        if s.input.actor == HOST and s.input.type == "Started"
    ]  # fmt: skip
    assert len(started) == 1 and isinstance(started[0], Started)
    assert started[0].args["shared_reads"] is True
    assert Host().shared_reads is False  # a Started record without the argument: as before
