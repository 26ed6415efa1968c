"""Recovery on a live single-process daemon, through the official `openai` client: `deepserve
fault kill-te` during load kills the TE's pod (its actors stop answering); the heartbeat monitor
notices, the cluster manager replaces it through the cold path, and every request finishes or
fails with a clear error — none hangs. The log replays identically."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon, stream_story

from deepserve.core.codec import decode
from deepserve.persistence import open_log
from deepserve.replay import verify

MODEL = "llama3-8b"
# Round robin: every TE gets its share whatever its load (a load-aware policy would avoid te/1, whose
# streams the JE still counts until the monitor notices). 8 misses (2 s) before a TE is failed: the
# window in which the second wave reaches the dead te/1, and room for a late heartbeat under load.
SETTINGS = ("control.heartbeat_interval_s=0.25", "control.heartbeat_misses=8", "control.pod_start_s=0.2",
            "control.te_preload_s=0.3", "pd.prefill_tes=0", "pd.decode_tes=0",
            "scheduling.policy=round_robin")  # fmt: skip
REQUESTS = 40
HANG_GUARD_S = 60.0  # a request that takes longer than this hangs
READY_TIMEOUT_S = 60.0  # te/1's replacement ready (seconds on a quiet machine)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=60)


async def load(url: str, admin_url: str) -> list[tuple[str, str]]:
    """Two waves, paced by the kill rather than by the clock (the `fault` process alone can take
    seconds to start on a loaded machine): the first streams while te/1 is killed (its streams
    are cut), the second is sent the moment the kill is acknowledged, so its share for te/1
    reaches a dead TE before the monitor notices, and is retried elsewhere."""
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=HANG_GUARD_S)

    async def one(i: int, delay_s: float) -> tuple[str, str]:
        await asyncio.sleep(delay_s)
        return await stream_story(c, MODEL, i, 96)

    half = REQUESTS // 2
    first = [asyncio.create_task(one(i, i * 0.075)) for i in range(half)]
    await asyncio.sleep(0.3)
    killed = await asyncio.to_thread(cli, "fault", "kill-te", "te/1", "--admin-url", admin_url)
    assert killed.returncode == 0 and "KillPod -> pods" in killed.stdout, killed.stderr
    second = [one(i, 0.0) for i in range(half, REQUESTS)]
    return list(await asyncio.wait_for(asyncio.gather(*first, *second), HANG_GUARD_S + 10))


def test_kill_te_during_load_none_hangs_and_the_te_is_replaced(tmp_path: Path) -> None:
    proc, info = start_daemon(tmp_path / "run", *[a for s in SETTINGS for a in ("--set", s)])
    try:
        results = asyncio.run(load(info["url"], info["admin_url"]))
        finished = [r for r in results if r == ("finished", "length")]
        aborted = [r for r in results if r[0] == "aborted"]  # cut mid-stream: the TE died
        for _, why in aborted:  # said in the stream: how far it got and why
            assert why.startswith("the request failed after ") and " output token" in why, why
        errors = [r for r in results if r[0] == "error"]
        assert len(finished) + len(aborted) + len(errors) == REQUESTS
        assert len(finished) >= REQUESTS // 2
        for _, why in errors:  # failed before any token: a clear 503 naming the cause
            assert why.startswith("503") and "te/1" in why, why
        end = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < end:
            st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
            te1 = next(t for t in st["tes"] if t["te"] == "te/1")
            if (te1["generation"], te1["state"]) == (2, "ready"):
                break
            time.sleep(0.2)
        assert (te1["generation"], te1["state"]) == (2, "ready"), te1
        assert "heartbeats missed" in te1["reason"]
        assert set(te1["boot_steps"]) >= {"pod_start", "te_pre_load", "ssd_to_dram", "dram_to_npu", "registered"}
        assert st["groups"][f"{MODEL}/colocated"]["ready"] == 3
        assert st["inflight"] == 0
        shown = cli("status", "--admin-url", info["admin_url"])
        assert shown.returncode == 0 and "gen 2   ready" in shown.stdout
        faults = httpx.get(info["admin_url"] + "/admin/faults", timeout=10).json()["inputs"]
        assert any(f["input"] == "KillPod" and f["from"] == "ext/admin" for f in faults)
        after = httpx.post(info["url"] + "/v1/completions", json={"model": MODEL, "prompt": "again", "max_tokens": 4,
                                                                  "ignore_eos": True}, timeout=30)  # fmt: skip
        assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    log = open_log(info["log"])
    try:
        assert verify(log).identical
        retried = [e for step in log.steps(None, actor="je/0") for e in step.events if e.type == "RouteDecided"
                   and decode(e.type, e.payload).attempt > 1]  # fmt: skip
        assert retried, "no task of te/1 was retried elsewhere"
    finally:
        log.close()
