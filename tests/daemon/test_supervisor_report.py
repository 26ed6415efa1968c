"""A TE process that dies (`deepserve up --processes`) is reported by the supervisor the moment it
is reaped (issue 30 §2): the cluster manager fails the TE and launches its replacement at once —
not after the heartbeats' misses (here 3 × 2 s), while the JE still routed requests to a process
that was gone and `deepserve status` showed it `ready` with no pid. The report is an external
input (`ext/supervisor` → `pods`), so the manager's decision is in the log and replays."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from cliproc import in_process
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.cluster.state import TeDeclaredFailed
from deepserve.core.codec import decode
from deepserve.daemon.procs.messages import ProcessExited
from deepserve.persistence import open_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="processes mode, kill -9")
MODEL = "llama3-8b"
HEARTBEAT_S, MISSES = 2.0, 3  # the heartbeats alone would take 6 s to fail the dead TE
SETTINGS = (f"control.heartbeat_interval_s={HEARTBEAT_S}", f"control.heartbeat_misses={MISSES}",
            "control.te_preload_s=0.3", "cluster.tes=2", "control.spare_tes=0", "pd.prefill_tes=0",
            "pd.decode_tes=0",
            # the streams the kill cuts say why (request migration, on in the daemon's default
            # config, would continue them: tests/daemon/test_stream_migration.py)
            "scheduling.migration.enabled=false")  # fmt: skip
VICTIM = "te/1"
REQUESTS = 12


def status(admin_url: str) -> dict[str, Any]:
    return httpx.get(admin_url + "/admin/status", timeout=10).json()


def row(st: dict[str, Any], te: str) -> dict[str, Any]:
    return next(t for t in st["tes"] if t["te"] == te)


def lateness_count(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return float(next(line.split()[-1] for line in text.splitlines()
                      if line.startswith("deepserve_npu_timer_lateness_seconds_count")))  # fmt: skip


async def stream_one(c: openai.AsyncOpenAI, i: int, started: asyncio.Semaphore) -> tuple[str, str]:
    """One streamed `/v1/completions` request (its error text said "chat task"): ("finished",
    finish_reason), ("error", "status: message") before any token, or ("aborted", message) when
    the stream was cut after output."""
    try:
        stream = await c.completions.create(model=MODEL, prompt=f"a completion {i} " * 6, max_tokens=200,
                                            stream=True, extra_body={"ignore_eos": True})  # fmt: skip
        finish, first = "", True
        async for chunk in stream:
            if first:
                started.release()
                first = False
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return ("finished", finish)
    except openai.APIStatusError as exc:
        return ("error", f"{exc.status_code}: {exc.message}")
    except openai.APIError as exc:
        return ("aborted", exc.message)


async def kill_under_load(url: str, admin: str, victim_pid: int) -> tuple[list[tuple[str, str]], float, dict]:
    """Every stream has its first token (on both TEs); SIGKILL the victim; poll status until it
    shows the failure."""
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    started = asyncio.Semaphore(0)
    tasks = [asyncio.create_task(stream_one(c, i, started)) for i in range(REQUESTS)]
    for _ in range(REQUESTS):
        await asyncio.wait_for(started.acquire(), 30)
    killed_at = time.monotonic()
    os.kill(victim_pid, signal.SIGKILL)
    seen: dict[str, Any] = {}
    while time.monotonic() - killed_at < 30:
        seen = row(await asyncio.to_thread(status, admin), VICTIM)
        if seen["generation"] > 1:
            break
        await asyncio.sleep(0.05)
    noticed_s = time.monotonic() - killed_at
    try:
        results = await asyncio.wait_for(asyncio.gather(*tasks), 90)
    finally:
        await c.close()
    return list(results), noticed_s, seen


def test_a_killed_te_process_is_failed_and_replaced_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, info = start_daemon(run_dir, "--processes", *[a for s in SETTINGS for a in ("--set", s)])
    try:
        admin = info["admin_url"]
        end = time.monotonic() + 40
        while not (len((st := status(admin))["tes"]) == 2 and all(t["state"] == "ready" for t in st["tes"])):
            assert time.monotonic() < end, st["tes"]
            time.sleep(0.1)
        victim_pid = row(st, VICTIM)["pid"]
        results, noticed_s, seen = asyncio.run(kill_under_load(info["url"], admin, victim_pid))
        # the TE processes' NPU timer lateness reaches /metrics (their status files), the dead one's too
        late = lateness_count(info["url"])
        assert late > 0
        # status: the dead generation is gone from view at once — a new generation replacing it
        assert seen["generation"] == 2 and seen["state"] in ("replacing", "ready"), seen
        assert seen["pid"] != victim_pid and "its pod exited" in seen["reason"], seen
        # well before the heartbeats could have noticed (a generous bound for a loaded machine)
        assert noticed_s < HEARTBEAT_S * MISSES / 2, noticed_s
        assert len(results) == REQUESTS and all(r[0] in ("finished", "aborted", "error") for r in results)
        for kind, why in results:  # cut by the kill: the stream says why, naming the process's end
            assert kind == "finished" or "SIGKILL" in why or VICTIM in why, (kind, why)
            assert "chat task" not in why, why  # a completion's said so; no API's task is "chat"
        cut = [why for kind, why in results if kind == "aborted"]  # cut mid-stream: every stream had output
        assert cut and len(cut) < REQUESTS, results  # the kill hit streams in flight, te/0's finished
        assert all("its generation (prefill and decode) task failed after output streamed" in w for w in cut), cut
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out

    log = open_log(str(run_dir / "daemon.db"))
    try:
        exits = [(s.input.t, s.input.src, decode(s.input.type, s.input.payload)) for s in log.steps(None, actor="pods")
                 if s.input.type == ProcessExited.__name__]  # fmt: skip
        failed = [(s.input.t, decode(e.type, e.payload)) for s in log.steps(None, actor="cluster") for e in s.events
                  if e.type == TeDeclaredFailed.__name__]  # fmt: skip
    finally:
        log.close()
    (crash,) = [(t, src, m) for t, src, m in exits if not m.shutdown]
    assert crash[1] == "ext/supervisor" and crash[2].pod_id == f"{VICTIM}#g1" and crash[2].returncode == -9
    (decided,) = failed  # one failure, the manager's own decision on the supervisor's report
    assert decided[1].te == VICTIM and decided[1].generation == 1
    assert decided[1].reason == f"its pod exited: the TE process (pid {victim_pid}) was killed by SIGKILL"
    assert decided[0] - crash[0] < 0.5  # decided as the report arrived (two hops in one process)
    v = in_process("replay", "verify", str(run_dir / "daemon.db"), cwd=run_dir)
    assert v.returncode == 0 and v.stdout.startswith("identical"), v.stdout + v.stderr
