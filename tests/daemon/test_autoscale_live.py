"""The autoscaler in the daemon (issue 34 acceptance 4): a load spike through the HTTP API (the
official `openai` client) scales the colocated group out, and once the spike is over back in;
`deepserve status` shows the autoscaler and the P/D pool's instance pools; the run replays. In
process and with one OS process per TE (`up --processes`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemonproc import start_daemon, stop_daemon, stream_story, wait_for

from deepserve.persistence import open_log
from deepserve.replay import verify

GROUP = "llama3-8b/colocated"
SETTINGS = ("cluster.tes=1", "control.spare_tes=1", "pd.prefill_tes=1", "pd.decode_tes=1",
            "control.pod_start_s=0.2", "control.te_preload_s=0.3", "autoscale.enabled=true",
            f"autoscale.groups=['{GROUP}']", "autoscale.interval_s=0.25", "autoscale.target_load=2",
            "autoscale.scale_in_load=1", "autoscale.window_s=2", "autoscale.scale_out_cooldown_s=1",
            "autoscale.scale_in_cooldown_s=2", "autoscale.max_tes=2")  # fmt: skip
SPIKE = 12


async def spike(url: str, admin: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    import openai

    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    streams = [asyncio.create_task(stream_story(c, "llama3-8b", i, 150)) for i in range(SPIKE)]
    # while the spike runs, the autoscaler asks for a second TE (it boots through the cold path)
    out = await asyncio.to_thread(wait_for, admin, lambda s: s["groups"][GROUP]["target"] == 2)
    return await asyncio.gather(*streams), out


@pytest.mark.parametrize("mode", [(), ("--processes",)], ids=["inproc", "processes"])
def test_a_load_spike_scales_out_and_back_in(tmp_path: Path, mode: tuple[str, ...]) -> None:
    proc, info = start_daemon(tmp_path / "run", *mode, *[a for s in SETTINGS for a in ("--set", s)])
    admin = info["admin_url"]
    try:
        # (with --processes the TEs start in their processes after the daemon is up)
        st = wait_for(admin, lambda s: all(g["ready"] == g["target"] for g in s["groups"].values()))
        assert st["groups"][GROUP] == {"target": 1, "ready": 1, "slots": 2}
        assert st["pools"] == {"llama3-8b": {"P": ["te/2"], "D": ["te/3"], "P->D": [], "D->P": []}}
        results, out = asyncio.run(spike(info["url"], admin))
        assert results == [("finished", "length")] * SPIKE
        assert out["groups"][GROUP]["target"] == 2 and out["autoscale"]["scale_outs"] >= 1, out["autoscale"]
        # the new TE comes up, and once the spike is over the group is drained back to one
        back = wait_for(admin, lambda s: s["groups"][GROUP]["target"] == 1 and s["autoscale"]["scale_ins"] >= 1)
        assert back["groups"][GROUP]["target"] == 1, back["autoscale"]
        te1 = next(t for t in back["tes"] if t["te"] == "te/1")
        assert "registered" in te1["boot_steps"] and te1["state"] in ("draining", "stopped"), te1
        shown = subprocess.run([sys.executable, "-m", "deepserve", "status", "--admin-url", admin],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert "pools llama3-8b: P [te/2]  D [te/3]  P->D []  D->P []" in shown.stdout
        assert "autoscale load:" in shown.stdout and "scale-ins" in shown.stdout
    finally:
        stop_daemon(proc)
    reader = open_log(str(tmp_path / "run"))
    try:
        assert verify(reader).identical
    finally:
        reader.close()
