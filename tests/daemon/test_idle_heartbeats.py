"""An idle daemon backs its heartbeats off (control.heartbeat_idle_max_interval_s) and a request
brings them back: the frontend sends the monitor one `HeartbeatWake` (logged, an input like any
other), and the log replays identically."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from inproc import FAST, load, quiet, started

from deepserve.cluster.control import MONITOR_ADDR
from deepserve.persistence import open_log
from deepserve.replay import verify

SETTINGS = (*FAST, "control.heartbeat_interval_s=0.1", "control.heartbeat_idle_max_interval_s=3.2")


async def _run(run_dir: Path) -> dict[str, Any]:
    rt, _ = await started(run_dir, *SETTINGS)
    try:
        mon = rt.driver.actor(MONITOR_ADDR)  # type: ignore[union-attr]
        for _ in range(1000):  # 0.1, 0.2, 0.4, 0.8, 1.6 s: backed off within ~2 s
            if mon.state.interval_s >= 1.6:
                break
            await asyncio.sleep(0.02)
        backed_off = mon.state.interval_s
        await load(rt, 4, 2, 4)
        return {"backed_off": backed_off, "after": mon.state.interval_s, "log": str(rt.log_path)}
    finally:
        await rt.stop(2.0)


def test_a_request_wakes_backed_off_heartbeats(tmp_path: Path) -> None:
    with quiet():
        r = asyncio.run(_run(tmp_path / "run"))
    assert r["backed_off"] >= 1.6
    assert r["after"] < r["backed_off"]  # woken (and busy rounds since keep it at the base)
    log = open_log(r["log"])
    try:
        assert verify(log).identical
        wakes = [s.input for s in log.steps(None, actor=MONITOR_ADDR) if s.input.type == "HeartbeatWake"]
    finally:
        log.close()
    # at most one a monitor tick (a short request may end before the woken tick sees it busy)
    assert 1 <= len(wakes) <= 4 and all(w.src == "ext/http" for w in wakes)
