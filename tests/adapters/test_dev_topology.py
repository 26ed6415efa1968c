"""Topology builders and routes, fault plans as logged external inputs, and determinism of a
whole emulated cluster (same seed, same inputs: the same log, byte for byte)."""

from __future__ import annotations

import pytest
from dev_harness import (
    answer_for,
    answers,
    assert_state_is_fold,
    handler_failures,
    log_encoding,
    make_driver,
    send,
)

from deepserve.actors.ports.faults import (
    HbmRegionFault,
    LinkDegrade,
    LinkDown,
    LinkFlap,
    NpuCrash,
    NpuHang,
    NpuReset,
)
from deepserve.actors.ports.host import HostLoad
from deepserve.actors.ports.link import LinkTransfer
from deepserve.actors.ports.npu import NpuAlloc, NpuForward, SeqShape
from deepserve.adapters.hardware.devices.faults import FaultAt, schedule_faults
from deepserve.adapters.hardware.devices.topology import (
    FABRIC,
    cloudmatrix384,
    gen1_cluster,
    route,
)
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

GB = 10**9


def test_gen1_routes():
    t = gen1_cluster(2)
    assert route(t, "hw/s0/npu1", "hw/s0/npu6").resources == ("s0/hccs/1-6:1>6",)
    assert route(t, "hw/s0/npu6", "hw/s0/npu1").resources == ("s0/hccs/1-6:6>1",)
    assert route(t, "hw/s0/npu1", "hw/s0/npu6", via="roce").resources == (
        "s0/npu1/roce:tx", "s0/npu6/roce:rx",
    )  # fmt: skip
    assert route(t, "hw/s0/npu1", "hw/s1/npu1").link_kind == "roce"
    assert route(t, "hw/s1/ssd", "hw/s1/npu2").resources == (
        "s1/ssd:rd", "s1/host/pcie:h2d", "s1/npu2/pcie:h2d",
    )  # fmt: skip
    assert route(t, "hw/s0/npu2", "hw/s0/host").resources == (
        "s0/npu2/pcie:d2h",
        "s0/host/pcie:d2h",
    )
    for src, dst, err in [
        ("hw/s0/npu1", "hw/s0/npu1", "same endpoint"),
        ("hw/s0/host", "hw/s1/npu0", "other server"),
        ("hw/s0/npu8", "hw/s0/npu0", "8 NPUs"),
        ("te/0", "hw/s0/npu0", "is not hw/s<i>/npu<j>"),
    ]:
        with pytest.raises(ValueError, match=err):
            route(t, src, dst)


def test_cloudmatrix384_routes_everything_over_ub():
    t = cloudmatrix384(4)
    assert t.npus_per_server == 16 and len(t.npus()) == 64
    r = route(t, "hw/s0/npu15", "hw/s3/npu0")
    assert r.resources == ("s0/npu15/ub:tx", "s3/npu0/ub:rx") and r.link_kind == "ub"
    # global shared memory: a CPU reaches a die on another server
    assert route(t, "hw/s1/host", "hw/s2/npu3").resources == ("s1/host/ub:h2d", "s2/npu3/ub:rx")
    with pytest.raises(ValueError, match="over 'ub'"):
        route(t, "hw/s0/npu0", "hw/s0/npu1", via="roce")


def test_spawned_cluster_answers_at_every_address():
    d = make_driver(cloudmatrix384(2))
    for addr in cloudmatrix384(2).npus():
        send(d, addr, NpuAlloc(req_id=addr, region="kv", nbytes=GB))
    d.run()
    assert len(answers(d)) == 32
    assert d.alive(FABRIC) and d.alive("hw/s1/host") and d.alive("hw/s1/npu15")


def test_fault_plans_are_logged_external_inputs_and_checked():
    d = make_driver(gen1_cluster(1))
    schedule_faults(
        d,
        [
            FaultAt(2.0, "hw/s0/npu1", NpuCrash()),
            FaultAt(1.0, FABRIC, LinkDown(link="s0/npu0/roce")),
        ],
    )
    d.run()
    faults = [s.input for s in d.sink.steps if s.input.src == "ext/fault"]
    assert [(i.t, i.actor, i.type, i.external) for i in faults] == [
        (1.0, FABRIC, "LinkDown", True), (2.0, "hw/s0/npu1", "NpuCrash", True),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="goes to the fabric"):
        schedule_faults(d, [FaultAt(3.0, "hw/s0/npu1", LinkDown(link="s0/npu0/roce"))])
    with pytest.raises(ValueError, match="goes to an NPU"):
        schedule_faults(d, [FaultAt(3.0, FABRIC, NpuHang())])


def _scenario(seed: int):
    """Every device kind busy, every fault kind injected, the NPUs' variance on."""
    d = make_driver(gen1_cluster(2), seed=seed, variance=True)
    for i in range(8):
        seqs = (SeqShape(1, 2000 + 100 * i),) * 16
        send(d, "hw/s0/npu0", NpuForward(req_id=f"f{i}", model="llama3-8b", seqs=seqs), at=0.01 * i)
        send(d, "hw/s1/npu2", NpuForward(req_id=f"g{i}", model="llama3-8b", seqs=seqs), at=0.01 * i)
    for i in range(6):
        xfer = LinkTransfer(
            req_id=f"x{i}",
            src=f"hw/s0/npu{i}",
            dst=f"hw/s1/npu{i}",
            nbytes=GB * (i + 1),
            fingerprint=f"fp{i}",
        )
        send(d, FABRIC, xfer, at=0.05 * i)
    send(
        d,
        "hw/s1/host",
        HostLoad(req_id="load", model="llama3-8b", targets=("hw/s1/npu4", "hw/s1/npu5")),
    )
    schedule_faults(d, [
        FaultAt(0.03, "hw/s0/npu0", NpuHang()),
        FaultAt(0.5, "hw/s0/npu0", NpuReset()),
        FaultAt(0.04, "hw/s1/npu2", HbmRegionFault(region="kv")),
        FaultAt(0.06, "hw/s0/npu7", NpuCrash()),
        FaultAt(0.1, FABRIC, LinkDegrade(link="s1/npu3/roce", bw_factor=0.3)),
        FaultAt(0.12, FABRIC, LinkDown(link="s0/npu4/roce")),
        FaultAt(0.2, FABRIC, LinkFlap(link="s1/npu5/pcie", down_s=0.5, up_s=0.5, count=3)),
    ])  # fmt: skip
    d.run()
    return d


def test_same_seed_same_log_and_state_is_a_fold_of_events():
    a, b = _scenario(11), _scenario(11)
    assert log_encoding(a) == log_encoding(b)
    assert handler_failures(a) == []
    for addr in (FABRIC, "hw/s0/npu0", "hw/s1/npu2", "hw/s0/npu7", "hw/s1/host"):
        assert_state_is_fold(a, addr)
    # every transfer ended exactly once, with its fingerprint when it completed
    for i in range(6):
        msg = answer_for(a, f"x{i}")[1]
        assert type(msg).__name__ == ("LinkTransferFailed" if i == 4 else "LinkTransferDone")
        assert i == 4 or msg.fingerprint == f"fp{i}"
    c = _scenario(12)
    durations = [m.duration_s for _, m in answers(a) if type(m).__name__ == "NpuForwardDone"]
    assert durations != [
        m.duration_s for _, m in answers(c) if type(m).__name__ == "NpuForwardDone"
    ]


def test_the_device_log_re_executes_identically():
    result = verify(MemoryLog(_scenario(5).sink))
    assert result.identical, result.summary()
    assert result.actors == 1 + 2 + 16
