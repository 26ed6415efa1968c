"""An NPU crash under an idle TE of a live daemon (`control.heartbeat_device_watch`, on in the
daemon's default config; actors/cluster/responder.py): the heartbeat responder's lease on the
NPU breaks, the next round says "device lost", the TE is declared failed within one heartbeat
interval — here while the heartbeats are backed off for idleness, which the crash wakes — and a
replacement serves the next request. The log replays identically."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from inproc import FAST, one, quiet, started

from deepserve.actors.ports.faults import NpuCrash
from deepserve.cluster.control import MANAGER_ADDR
from deepserve.core.codec import decode
from deepserve.persistence import open_log
from deepserve.replay import verify

INTERVAL_S = 0.2
SETTINGS = (*FAST, f"control.heartbeat_interval_s={INTERVAL_S}", "control.heartbeat_idle_max_interval_s=6.4")


async def _run(run_dir: Path) -> dict[str, Any]:
    rt, _ = await started(run_dir, *SETTINGS)
    try:
        te = rt.placement.tes[0]
        await asyncio.sleep(2.0)  # idle: the heartbeats back off (0.2, 0.4, 0.8, 1.6 s ...)
        crashed_at = asyncio.get_running_loop().time()
        await rt.admin_input(te.npus[0], NpuCrash(reason="test: idle crash"))
        for _ in range(3000):
            tes = rt.status()["tes"]
            if tes and tes[0]["state"] != "ready":
                break
            await asyncio.sleep(0.005)
        noticed_s = asyncio.get_running_loop().time() - crashed_at
        for _ in range(3000):  # the replacement boots (pod start and preload: 0.05 s each)
            tes = rt.status()["tes"]
            if tes and tes[0]["state"] == "ready" and tes[0].get("generation", 2) >= 2:
                break
            await asyncio.sleep(0.01)
        got, done = await one(rt, 1, 8)
        return {"te": te.addr, "noticed_s": noticed_s, "got": got, "status": done.status, "log": str(rt.log_path)}
    finally:
        await rt.stop(2.0)


def test_an_idle_te_whose_npu_crashed_is_declared_failed_and_replaced(tmp_path: Path) -> None:
    with quiet():
        r = asyncio.run(_run(tmp_path / "run"))
    assert r["noticed_s"] < 5 * INTERVAL_S  # one interval, with room for a loaded machine
    assert (r["got"], r["status"]) == (8, "completed")
    log = open_log(r["log"])
    try:
        assert verify(log).identical
        declared = [decode(e.type, e.payload) for s in log.steps(None, actor=MANAGER_ADDR) for e in s.events
                    if e.type == "TeDeclaredFailed"]  # fmt: skip
    finally:
        log.close()
    assert [(d.te, d.diagnosis) for d in declared] == [(r["te"], "device-lost")]
    assert "test: idle crash" in declared[0].reason
