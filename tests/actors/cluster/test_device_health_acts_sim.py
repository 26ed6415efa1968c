"""The cluster manager acts on the per-host device-health monitors' levels (P/D-Serve §3.4;
issue 33 §1), under `cluster.resilience.device_health` (actors/cluster/healthacts.py):
recoverable in place → recorded only; instance → the TE on the device declared failed and the
ladder run; node → the node tainted, so the ladder places the replacement elsewhere.

benchmarks/recovery.py's cluster (2 prefill TEs on server 0, 2 decode TEs on server 1, a spare
server 2; 60 requests of the Azure conversation trace), rung `substitute`, faults at 20 s on
decode te/2's NPU hw/s1/npu0."""

from __future__ import annotations

from typing import Any

from deepserve.actors.cluster.healthacts import HealthActed
from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.benchmarks.recovery import Run, simulate
from deepserve.cluster.control import MANAGER_ADDR
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

HEALTH = "cluster.resilience.device_health=true"
NAMES = {"HealthActed", "TeDeclaredFailed", "NodeTainted", "TeRelocated"}


def manager(run: Run) -> list[tuple[float, Any]]:
    return [(s.input.t, decode(e.type, e.payload)) for s in run.sink.steps if s.input.actor == MANAGER_ADDR
            for e in s.events if e.type in NAMES]  # fmt: skip


def declared(run: Run) -> list[tuple[float, str, str]]:
    return [(t, e.te, e.diagnosis) for t, e in manager(run) if type(e).__name__ == "TeDeclaredFailed"]


def test_an_instance_level_hang_is_declared_at_the_monitors_verdict_not_after_the_heartbeats_misses() -> None:
    before = simulate("substitute", "npu-hang", 60)
    assert declared(before) == [(23.0, "te/2", "hang")]  # 1 s x 3 heartbeat misses
    r = simulate("substitute", "npu-hang", 60, extra=[HEALTH])
    acted = [(t, e.device, e.kind, e.level, e.action, e.tes) for t, e in manager(r) if isinstance(e, HealthActed)]
    assert acted == [(21.0, "hw/s1/npu0", "hang", "instance", "declared failed (hang): the recovery ladder runs",
                      ("te/2",))]  # the monitor's probe unanswered for its 1 s  # fmt: skip
    assert declared(r) == [(21.0, "te/2", "hang")]
    moved = [(t, e.te, e.server) for t, e in manager(r) if type(e).__name__ == "TeRelocated"]
    assert moved == [(21.0, "te/2", 2)]  # the ladder ran: hang taints s1, substituted on the spare
    assert sorted({d.status for d in r.done.values()}) == ["completed"] and len(r.done) == 60
    assert verify(MemoryLog(r.sink)).identical  # type: ignore[arg-type]


MORE = (FaultSpec(at_s=10.0, kind="link-error", target="hw/s0/npu0"),  # recoverable in place, te/0's
        *(FaultSpec(at_s=19.0, kind="npu-crash", target=f"hw/s1/npu{i}") for i in (4, 5, 6)))  # idle NPUs  # fmt: skip
NO_TAINT = "recovery.taint=[]"  # a failure's diagnosis alone taints no node: only the node's level does


def test_a_node_level_report_taints_the_node_so_the_replacement_goes_to_the_spare() -> None:
    before = simulate("substitute", "npu-crash", 60, extra=[NO_TAINT], more=MORE)
    assert [(t, e.te, e.server) for t, e in manager(before) if type(e).__name__ == "TeRelocated"] == []  # in place
    r = simulate("substitute", "npu-crash", 60, extra=[NO_TAINT, HEALTH], more=MORE)
    acted = [(t, e.device, e.level, e.action) for t, e in manager(r) if isinstance(e, HealthActed)]
    assert acted == [
        (10.0, "hw/s0/npu0", "recoverable-in-place", "none: recoverable in place"),
        (19.0, "hw/s1/npu4", "instance", "none: no TE runs on it"),
        (19.0, "hw/s1/npu5", "instance", "none: no TE runs on it"),
        (19.0, "hw/s1/npu6", "instance", "none: no TE runs on it"),
        # the 4th of 8 NPUs at instance level: the node (reported before the device that took it there)
        (20.0, "hw/s1", "node", "tainted s1: replacements go elsewhere"),
        (20.0, "hw/s1/npu0", "instance", "declared failed (device-lost): the recovery ladder runs"),
    ]  # fmt: skip
    tainted = [(t, e.server) for t, e in manager(r) if type(e).__name__ == "NodeTainted"]
    assert tainted == [(20.0, 1)]
    assert declared(r) == [(20.0, "te/2", "device-lost")]
    assert [(t, e.te, e.server) for t, e in manager(r) if type(e).__name__ == "TeRelocated"] == [(20.0, "te/2", 2)]
    assert sorted({d.status for d in r.done.values()}) == ["completed"] and len(r.done) == 60
