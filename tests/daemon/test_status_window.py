"""`Runtime.status()` (GET /admin/status) while a DP master's cell exists but its `Started` has
not been delivered yet — the window a replacement TE opens, long under load. The endpoint once
answered 500 there (`cell.actor` is None until `Started`); it reports the master not alive."""

from __future__ import annotations

from pathlib import Path

import anyio

from deepserve.daemon.config import load_config
from deepserve.daemon.runtime import Runtime

SETTINGS = ("cluster.tes=1", "control.te_preload_s=0.05")


async def _status_in_the_window(run_dir: Path) -> tuple[dict, dict]:
    rt = Runtime(load_config(None, SETTINGS), run_dir)
    await rt.start()
    try:
        with anyio.fail_after(30):
            while not any(t["state"] == "ready" and t["dps"] and t["dps"][0]["alive"]
                          for t in rt.status()["tes"]):  # fmt: skip
                await anyio.sleep(0.02)
        ready = rt.status()
        te = next(t for t in ready["tes"] if t["state"] == "ready")
        assert rt.driver is not None
        cell = rt.driver.cells[te["dps"][0]["master"]]
        actor, cell.actor = cell.actor, None  # as between a spawn and its `Started`
        try:
            window = rt.status()
        finally:
            cell.actor = actor
        return ready, window
    finally:
        await rt.stop(grace_s=1.0)


def test_status_reports_a_master_not_yet_started_as_not_alive(tmp_path: Path) -> None:
    ready, window = anyio.run(_status_in_the_window, tmp_path / "run")
    te = next(t for t in ready["tes"] if t["state"] == "ready")
    assert te["dps"][0]["alive"] and "kv_blocks_total" in te["dps"][0]
    same = next(t for t in window["tes"] if t["te"] == te["te"])
    assert same["dps"][0] == {"master": te["dps"][0]["master"], "alive": False}
