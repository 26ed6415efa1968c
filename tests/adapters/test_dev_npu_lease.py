"""The NPU's heartbeat leases (`NpuProbe.lease_s`, actors/cluster/heartbeat.py): a healthy device
promises its holder word of any fault within the lease; a crash, hang, reset or HBM fault tells
every holder whose lease still runs, a pod's `NpuVoidLeases` only its TE's, an expired lease and
a repair of a healthy device (a no-op) nobody."""

from __future__ import annotations

from typing import Any

from deepserve.actors.ports.faults import HbmRegionFault, NpuCrash, NpuHang, NpuReset
from deepserve.actors.ports.npu import NpuLeaseBroken, NpuProbe, NpuVoidLeases
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.core import MemorySink, Message, SimDriver

NPU = "hw/s0/npu0"


def run(inputs: list[tuple[float, Message]]) -> list[tuple[float, str, str]]:
    d = SimDriver(1, sink=MemorySink())
    got: list[Any] = []
    d.on_external = lambda t, env: got.append((t, env.msg))
    d.spawn(NPU, Npu, npu="910b", variance=False)
    for at, msg in inputs:
        d.inject(NPU, msg, at=at, src="ext/monitor")
    d.run(until=100.0)
    return [(t, m.key, m.reason) for t, m in got if isinstance(m, NpuLeaseBroken)]


def lease(key: str, at: float = 1.0, lease_s: float = 10.0) -> tuple[float, Message]:
    return at, NpuProbe(req_id=f"hb:{key}", lease_s=lease_s, lease_to="ext/monitor", lease_key=key)


def test_every_fault_breaks_the_leases_still_running() -> None:
    for fault in (NpuCrash(), NpuHang(), NpuReset(), HbmRegionFault(region="kv")):
        got = run([lease("te/0#1"), lease("te/1#1", lease_s=2.0), (5.0, fault)])
        # te/1's lease ended at 3: only te/0's is broken
        assert got == [(5.0, "te/0#1", f"{type(fault).__name__} on {NPU}")], fault


def test_a_renewed_lease_replaces_the_old_one_and_a_repair_of_a_healthy_device_breaks_none() -> None:
    got = run([lease("te/0#1"), lease("te/0#1", at=8.0), (12.0, NpuReset(repair=True)), (15.0, NpuHang())])
    assert got == [(15.0, "te/0#1", f"NpuHang on {NPU}")]  # renewed at 8: runs to 18; told once


def test_a_killed_pod_voids_only_its_tes_leases() -> None:
    got = run([lease("te/0#1"), lease("te/1#2"), (4.0, NpuVoidLeases(key_prefix="te/1#", reason="pod killed")),
               (6.0, NpuCrash())])  # fmt: skip
    assert got == [(4.0, "te/1#2", "pod killed"), (6.0, "te/0#1", f"NpuCrash on {NPU}")]
