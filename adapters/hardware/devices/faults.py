"""Fault plans: hardware faults scheduled as external inputs, so they are logged and replayable.

schedule_faults(driver, [
    FaultAt(2.0, "hw/s0/npu3", NpuCrash()),
    FaultAt(5.0, FABRIC, LinkDown(link="s0/npu3/roce")),
])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from deepserve.actors.ports.faults import LINK_FAULTS, NPU_FAULTS
from deepserve.adapters.hardware.devices.topology import FABRIC
from deepserve.core import Message

FAULT_SOURCE = "ext/fault"


class FaultAt(msgspec.Struct, frozen=True):
    at_s: float
    target: str  # an NPU address for NPU faults, the fabric's for link faults
    fault: Message


def check_fault(f: FaultAt) -> None:
    """A fault must go where it can act: NPU faults to an NPU, link faults to a fabric."""
    if isinstance(f.fault, LINK_FAULTS) and f.target != FABRIC and "fabric" not in f.target:
        raise ValueError(
            f"target: link fault {type(f.fault).__name__} goes to the fabric, not {f.target!r}"
        )
    if isinstance(f.fault, NPU_FAULTS) and "/npu" not in f.target:
        raise ValueError(
            f"target: NPU fault {type(f.fault).__name__} goes to an NPU, not {f.target!r}"
        )
    if not isinstance(f.fault, LINK_FAULTS + NPU_FAULTS):
        raise ValueError(f"fault: {type(f.fault).__name__} is not a hardware fault")
    if f.at_s < 0:
        raise ValueError(f"at_s: must be >= 0, got {f.at_s}")


def schedule_faults(driver: Any, plan: Iterable[FaultAt], src: str = FAULT_SOURCE) -> list[int]:
    """Inject every fault of `plan` into a SimDriver at its time; returns the input ids."""
    plan = sorted(plan, key=lambda f: f.at_s)
    for f in plan:
        check_fault(f)
    return [driver.inject(f.target, f.fault, at=f.at_s, src=src) for f in plan]
