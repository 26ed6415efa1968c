"""A host's device-health monitor (P/D-Serve §3.4; issue 33 §1): faults on one 8-NPU server,
each recorded with its level — recoverable in place, instance, node — and when it was seen."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.health import (
    INSTANCE,
    NODE,
    RECOVERABLE,
    DeviceHealth,
    DeviceHealthMonitor,
    HealthReport,
    NodeDown,
)
from deepserve.actors.flowserve.distflow.probe import LINK_FAULT, SATURATION, KvLinkDiagnosis
from deepserve.actors.ports.faults import HbmRegionFault, NpuCrash, NpuHang, NpuLinkError, NpuReset
from deepserve.adapters.hardware.devices.topology import build, spawn_topology
from deepserve.core import SimDriver, decode
from deepserve.persistence.memory import MemoryLog, MemorySink
from deepserve.replay import verify

NPUS = tuple(f"hw/s0/npu{i}" for i in range(8))
MON = "hw/s0/health"


def run(faults: list[tuple[float, str, Any]], node_fraction: float = 0.25) -> tuple[SimDriver, list[Any]]:
    d = SimDriver(7, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    spawn_topology(d, build("gen1", 1), variance=False)
    d.spawn(MON, DeviceHealthMonitor, config={"host": "hw/s0", "npus": NPUS, "node_fraction": node_fraction,
                                              "report_to": "ext/ops"})  # fmt: skip
    for at, dst, msg in faults:
        d.inject(dst, msg, at=at, src="ext/fault")
    d.run(until=60.0)
    return d, out


def health(d: SimDriver, cls: type) -> list[tuple[float, Any]]:
    found = [decode(e.type, e.payload) for s in d.sink.steps if s.input.actor == MON  # type: ignore[attr-defined]
             for e in s.events if e.type == cls.__name__]  # fmt: skip
    return [(e.at_s, e) for e in found]


def test_each_fault_is_recorded_with_its_level_and_two_instance_faults_take_the_node_down() -> None:
    d, out = run([
        (1.0, NPUS[0], NpuLinkError()),
        (2.0, NPUS[1], HbmRegionFault(region="kv", span=(0.0, 0.1))),
        (3.0, MON, KvLinkDiagnosis(src="hw/s1/npu0", dst=NPUS[4], verdict=SATURATION, link="", failed_s=2.9, detected_s=3.0)),
        (4.0, NPUS[2], NpuCrash()),
        (5.0, NPUS[3], NpuHang()),
        (9.0, NPUS[3], NpuReset()),
    ])  # fmt: skip
    seen = [(t, e.device, e.kind, e.level) for t, e in health(d, DeviceHealth)]
    assert seen == [
        (1.0, NPUS[0], "link-error", RECOVERABLE), (1.0, NPUS[0], "healthy", ""),  # recovered in place at once
        (2.0, NPUS[1], "hbm-fault", RECOVERABLE),  # a part of the KV region: masked in place
        (3.0, NPUS[4], SATURATION, RECOVERABLE),
        (4.0, NPUS[2], "crash", INSTANCE),
        (6.0, NPUS[3], "hang", INSTANCE),  # silent for the probe's 1 s
        (9.0, NPUS[3], "healthy", ""),  # reset: asked again
    ]  # fmt: skip
    assert [(t, e.down, e.devices) for t, e in health(d, NodeDown)] == [(6.0, True, (NPUS[2], NPUS[3])),
                                                                        (9.0, False, (NPUS[2],))]  # fmt: skip
    reports = [m for m in out if isinstance(m, HealthReport)]
    assert [(m.device, m.level) for m in reports if m.kind == "node"] == [("hw/s0", NODE), ("hw/s0", "")]
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_a_whole_region_or_a_blocked_kv_link_is_an_instance_fault() -> None:
    d, _ = run([
        (1.0, NPUS[0], HbmRegionFault(region="weights")),
        (2.0, MON, KvLinkDiagnosis(src="hw/s1/npu0", dst=NPUS[5], verdict=LINK_FAULT, link="s0/npu5/roce",
                                   failed_s=2.0, detected_s=2.0)),
    ], node_fraction=1.0)  # fmt: skip
    seen = [(t, e.device, e.kind, e.level, e.detail) for t, e in health(d, DeviceHealth)]
    assert seen == [(1.0, NPUS[0], "hbm-fault", INSTANCE, "weights"),
                    (2.0, NPUS[5], LINK_FAULT, INSTANCE, "KV path from hw/s1/npu0 over s0/npu5/roce")]  # fmt: skip
    assert health(d, NodeDown) == []


SCENARIO = """
name = "health"
seed = 1
[cluster]
model = "llama3-8b"
tes = 2
kv_block_tokens = 16
[cluster.resilience]
token_recompute = true
device_health = true
[control]
heartbeats = true
[workload]
trace = "builtin:azure_conv_500"
[[faults]]
at_s = 10.0
kind = "link-error"
target = "hw/s0/npu0"
[[faults]]
at_s = 20.0
kind = "npu-crash"
target = "hw/s0/npu1"
"""


def test_the_simulation_spawns_a_monitor_per_server_when_asked(tmp_path: Any, capsys: Any) -> None:
    from deepserve.cli.main import main
    from deepserve.persistence import open_log

    (tmp_path / "health.toml").write_text(SCENARIO)
    db = str(tmp_path / "health.db")
    assert main(["sim", str(tmp_path / "health.toml"), "--requests", "60", "--log", db]) == 0
    capsys.readouterr()
    with open_log(db) as log:
        run = next(iter(log.runs()))
        seen = [(e.at_s, e.device, e.kind, e.level) for s in log.steps(run.run_id) if s.input.actor == MON
                for e in (decode(x.type, x.payload) for x in s.events) if isinstance(e, DeviceHealth)]  # fmt: skip
    assert seen == [(10.0, NPUS[0], "link-error", RECOVERABLE), (10.0, NPUS[0], "healthy", ""),
                    (20.0, NPUS[1], "crash", INSTANCE)]  # fmt: skip
