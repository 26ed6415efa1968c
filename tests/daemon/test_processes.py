"""`deepserve up --processes` (issue 7 §3): one OS process per TE over ZeroMQ. Under load from
the official `openai` client, one TE process is `kill -9`ed: its in-flight requests complete
elsewhere or fail with a clear error, none hangs; the supervisor reports the exit, the cluster
manager replaces the TE through the launcher (a new process, generation 2, ready in status);
SIGTERM while requests stream lets them finish, then leaves no process behind; and every
process's log verifies identical on its own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from cliproc import in_process
from daemonproc import start_daemon, stop_daemon, stream_story, wait_for

import deepserve.actors.je.actor  # noqa: F401  (registers the JE's event types for decode)
from deepserve.core.codec import decode
from deepserve.daemon.procs.messages import ProcessExited
from deepserve.persistence import open_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for orphans")
MODEL = "llama3-8b"
# 8 misses (2 s) of silence before a TE is failed: under CPU load a heartbeat hop between these
# processes was measured up to 0.28 s late with nothing wrong, and 3 (0.75 s) left a shared 2-core
# CI machine too little margin (a CI run saw live TEs' streams aborted in the SIGTERM phase).
SETTINGS = ("control.heartbeat_interval_s=0.25", "control.heartbeat_misses=8", "control.te_preload_s=0.3",
            "cluster.tes=2", "control.spare_tes=0")  # 2 colocated TEs + the 1P1D pair: 4 TE processes
REQUESTS = 40
HANG_GUARD_S = 45.0  # a request that takes longer than this hangs
VICTIM = "te/1"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def children_of(pid: int) -> set[int]:
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().split(") ", 1)[1].split()[1]) == pid:
                        out.add(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
                continue
    return out


async def load(url: str, victim_pid: int) -> list[tuple[str, str]]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=HANG_GUARD_S)

    async def one(i: int) -> tuple[str, str]:
        await asyncio.sleep(i * 0.05)  # arrivals over 2 s: some reach the victim after it died
        return await stream_story(c, MODEL, i, 64)

    async def kill() -> None:
        await asyncio.sleep(0.4)
        os.kill(victim_pid, signal.SIGKILL)

    k = asyncio.create_task(kill())
    try:
        results = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(REQUESTS))), HANG_GUARD_S + 10)
    finally:
        await c.close()
    await k
    return results


STREAMING = 6


async def stop_under_load(url: str, proc: subprocess.Popen[str]) -> list[tuple[str, str]]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=HANG_GUARD_S)
    started = asyncio.Semaphore(0)

    async def one(i: int) -> tuple[str, str]:
        try:
            stream = await c.completions.create(model=MODEL, prompt=f"a last one {i}", max_tokens=48, stream=True,
                                                extra_body={"ignore_eos": True})  # fmt: skip
            finish, first = "", True
            async for chunk in stream:
                if first:
                    started.release()
                    first = False
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return ("finished", finish)
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            return ("error", str(exc))

    tasks = [asyncio.create_task(one(i)) for i in range(STREAMING)]
    for _ in range(STREAMING):
        await asyncio.wait_for(started.acquire(), 60)
    proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        await c.close()


def request_story(url: str, admin: str) -> list[dict[str, Any]]:
    """A finished request's steps from `/admin/requests/{id}`, once a TE process's log has them."""
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "tell it", "max_tokens": 4}, timeout=30)
    rid = r.headers["x-request-id"]
    end, steps = time.monotonic() + 60, []
    while time.monotonic() < end:  # each log commits a few milliseconds behind its process
        got = httpx.get(f"{admin}/admin/requests/{rid}", timeout=10)
        steps = got.json().get("steps", []) if got.status_code == 200 else []
        if any("JobFinished" in s["events"] for s in steps) and any(s["process"] != "daemon" for s in steps):
            break
        time.sleep(0.1)
    return steps


def test_kill_9_a_te_process_under_load(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, info = start_daemon(run_dir, "--processes", *[a for s in SETTINGS for a in ("--set", s)])
    pids: set[int] = set()
    try:
        admin = info["admin_url"]
        st = wait_for(admin, lambda s: all(t["state"] == "ready" for t in s["tes"]) and len(s["tes"]) == 4, 60)
        assert st["mode"] == "processes" and [t["state"] for t in st["tes"]] == ["ready"] * 4, st["tes"]
        victim = next(t for t in st["tes"] if t["te"] == VICTIM)
        pids |= {p["pid"] for p in st["processes"]} | children_of(proc.pid)
        assert victim["pid"] in pids and alive(victim["pid"]) and victim["pid"] != proc.pid

        results = asyncio.run(load(info["url"], victim["pid"]))
        finished = [r for r in results if r == ("finished", "length")]
        aborted = [r for r in results if r[0] == "aborted"]  # cut mid-stream: its TE died
        for _, why in aborted:  # said in the stream: how far it got and why
            assert why.startswith("the request failed after ") and " output token" in why, why
        errors = [r for r in results if r[0] == "error"]
        assert len(finished) + len(aborted) + len(errors) == REQUESTS, results
        assert len(finished) >= REQUESTS // 2, results
        for _, why in errors:  # failed before any token: a clear error naming the dead TE
            assert why.startswith("503") and VICTIM in why, why

        st = wait_for(admin, lambda s: next(t for t in s["tes"] if t["te"] == VICTIM)["state"] == "ready"
                      and next(t for t in s["tes"] if t["te"] == VICTIM)["generation"] == 2, 60)  # fmt: skip
        row = next(t for t in st["tes"] if t["te"] == VICTIM)
        assert (row["generation"], row["state"], row["process"]) == (2, "ready", "up"), row
        assert "its pod exited" in row["reason"] and "SIGKILL" in row["reason"], row  # the supervisor's report
        assert row["pid"] != victim["pid"] and alive(row["pid"]) and not alive(victim["pid"])
        assert st["groups"][f"{MODEL}/colocated"]["ready"] == 2 and st["inflight"] == 0
        pids |= {p["pid"] for p in st["processes"]} | children_of(proc.pid)
        story = request_story(info["url"], admin)  # one request, told from every process's log
        te_steps = [s for s in story if s["actor"].startswith("te/")]
        assert story[0]["process"] == "daemon" and story[0]["input"] == "ApiRequest", story[:2]
        assert te_steps and all(s["process"].startswith("te-") for s in te_steps), story
        assert [s["t"] for s in story] == sorted(s["t"] for s in story)
        shown = in_process("status", "--admin-url", admin, cwd=tmp_path)
        assert shown.returncode == 0 and f"pid {row['pid']}" in shown.stdout, shown.stdout + shown.stderr
        # SIGTERM while requests stream: they finish (the grace period), then every process stops.
        streaming = asyncio.run(stop_under_load(info["url"], proc))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    assert len(pids) >= 5  # 4 TE processes and the replacement
    assert not [p for p in pids if alive(p)], "orphan TE processes after SIGTERM"

    logs = sorted(p.name for p in run_dir.glob("*.db"))
    assert logs == ["daemon.db", "te-0-g1.db", "te-1-g1.db", "te-1-g2.db", "te-2-g1.db", "te-3-g1.db"], logs
    v = in_process("replay", "verify", str(run_dir), cwd=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr
    assert v.stdout.startswith("identical: ") and "6 logs, each verified on its own" in v.stdout, v.stdout
    assert v.stdout.count(": identical:") == 6, v.stdout

    log = open_log(str(run_dir / "daemon.db"))
    try:  # the kill hit work in flight: tasks of the victim were retried elsewhere or failed naming it
        retried = [e for step in log.steps(None, actor="je/0") for e in step.events if e.type == "RouteDecided"
                   and decode(e.type, e.payload).attempt > 1]  # fmt: skip
        exits = [decode(s.input.type, s.input.payload) for s in log.steps(None, actor="pods")
                 if s.input.type == ProcessExited.__name__]  # fmt: skip
        unfinished = [(d.request_id, d.status, d.reason) for step in log.steps(None, actor="je/0") for e in step.events
                      if e.type == "JobFinished" and (d := decode(e.type, e.payload).done).status != "completed"]  # fmt: skip
    finally:
        log.close()
    # SIGTERM while requests streamed: every one of them finished (the grace period)
    assert streaming == [("finished", "length")] * STREAMING, (streaming, unfinished[-STREAMING:])
    assert retried or errors or aborted, "the kill hit no request in flight"
    assert [(e.pod_id, e.returncode) for e in exits if e.returncode < 0] == [("te/1#g1", -signal.SIGKILL)]
    # the clean stop: every other TE process exited 0 after SIGTERM, its exit recorded
    assert sorted(e.pod_id for e in exits if e.returncode == 0) == ["te/0#g1", "te/1#g2", "te/2#g1", "te/3#g1"]
