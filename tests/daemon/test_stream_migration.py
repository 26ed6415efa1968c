"""Request migration with stream continuation (issue 33, xLLM §3.5), on a live `deepserve up`
through the official `openai` client: 10 concurrent streamed chat completions (max_tokens 200,
ignore_eos); the TE serving them is killed mid-stream — `deepserve fault kill-te` in-process,
`kill -9` of its process with `--processes` — and every stream still finishes normally with
exactly 200 completion tokens, its text the very text an undisturbed run of the same seeds
streams (no token twice, none skipped), and `replay why` shows the migration, resumed at the
client's position as the frontend counted it."""

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
from daemonproc import start_daemon, stop_daemon

MODEL = "llama3-8b"
STREAMS = 10
TOKENS = 200
MID_CHUNKS = 8  # every stream has this many content chunks before the kill: it lands mid-stream
# Two colocated TEs (the victim and where its streams go), no P/D pair. Prefix locality with one
# prompt and no load bound: the first request lands on a TE and all the others follow its cached
# prefix there, so the kill hits every stream (the default bound of 4 spreads them 5/5).
COMMON = ("control.pod_start_s=0.2", "control.te_preload_s=0.3", "pd.prefill_tes=0", "pd.decode_tes=0",
          "cluster.tes=2", "control.spare_tes=0", "scheduling.policy=locality",
          f"scheduling.params.load_bound={STREAMS}")  # fmt: skip
PROMPT = "tell me a long story about a lighthouse keeper " * 8


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """A client command as its own process: safe from the kill's worker thread (`in_process`
    redirects this process's stdout and changes its working directory)."""
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=120)


def why(run: Path, rid: str) -> subprocess.CompletedProcess[str]:
    """`replay why` answered by `main()` here: one per stream, each a Python start and
    deepserve's imports as a subprocess (~0.4 s quiet, more loaded)."""
    return in_process("replay", "why", str(run), rid, cwd=run.parent)


def serving(admin_url: str) -> dict[str, Any]:
    """The TE running the most requests now (its pid with --processes)."""
    st = httpx.get(admin_url + "/admin/status", timeout=10).json()
    return max(st["tes"], key=lambda t: sum(dp.get("running", 0) for dp in t["dps"]))


async def one(c: openai.AsyncOpenAI, i: int, progress: list[int]) -> tuple[str, str, str, int]:
    raw = await c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, seed=7000 + i,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})  # fmt: skip
    rid = raw.headers["x-request-id"]
    text, finish, used = "", "", -1
    async for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            progress[i] += bool(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return rid, text, finish, used


async def wave(url: str, kill: Any = None) -> tuple[list[tuple[str, str, str, int]], Any]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    progress = [0] * STREAMS
    try:
        streams = [asyncio.create_task(one(c, i, progress)) for i in range(STREAMS)]
        killed = None
        if kill is not None:
            end = time.monotonic() + 60
            while min(progress) < MID_CHUNKS and time.monotonic() < end and not any(s.done() for s in streams):
                await asyncio.sleep(0.005)
            assert not any(s.done() for s in streams), "a stream ended before the kill"
            killed = await asyncio.to_thread(kill)
        return list(await asyncio.wait_for(asyncio.gather(*streams), 150)), killed
    finally:
        await c.close()


def check(run: Path, info: dict[str, Any], during: list[Any], again: list[Any], victim: str,
          moved_at_least: int = STREAMS) -> None:  # fmt: skip
    for (rid, text, finish, used), (_, text2, finish2, used2) in zip(during, again, strict=True):
        assert (finish, used) == ("length", TOKENS), (rid, finish, used)
        assert (finish2, used2) == ("length", TOKENS)
        assert text == text2, rid  # no token twice, none skipped: the undisturbed run's very text
    moved = []
    for rid, *_ in during:
        said = why(run, rid)
        assert said.returncode == 0, said.stderr
        if "MIGRATED" in said.stdout:
            moved.append(rid)
            assert f"MIGRATED off {victim}" in said.stdout and "recompute" in said.stdout, said.stdout
            # resumed where the client was (the frontend's count), not at the first chunk: the new
            # TE prefills the prompt and those tokens, it does not decode them again
            at = int(said.stdout.split("resumes at output token ")[1].split()[0])
            assert "(the frontend's position" in said.stdout and at >= MID_CHUNKS, said.stdout
    assert len(moved) >= moved_at_least, (len(moved), victim)  # here: all of them were on the TE killed


def test_kill_te_mid_stream_every_stream_finishes_with_its_200_tokens(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = (*COMMON, "control.heartbeat_interval_s=0.25", "control.heartbeat_misses=3")
    proc, info = start_daemon(run, *[a for s in sets for a in ("--set", s)])
    victim: dict[str, Any] = {}
    try:
        def kill() -> subprocess.CompletedProcess[str]:
            victim.update(serving(info["admin_url"]))
            return cli("fault", "kill-te", victim["te"], "--admin-url", info["admin_url"])

        during, killed = asyncio.run(wave(info["url"], kill))
        assert killed.returncode == 0, killed.stderr
        again, _ = asyncio.run(wave(info["url"]))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    check(run, info, during, again, victim["te"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kill -9 of a TE process")
def test_kill_9_of_the_te_process_mid_stream_every_stream_finishes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = (*COMMON, "control.heartbeat_interval_s=0.25", "control.heartbeat_misses=8")
    proc, info = start_daemon(run, "--processes", *[a for s in sets for a in ("--set", s)])
    victim: dict[str, Any] = {}
    try:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
            if len(st["tes"]) == 2 and all(t["state"] == "ready" for t in st["tes"]):
                break
            time.sleep(0.1)

        def kill() -> int:
            victim.update(serving(info["admin_url"]))
            os.kill(victim["pid"], signal.SIGKILL)
            return victim["pid"]

        during, _ = asyncio.run(wave(info["url"], kill))
        again, _ = asyncio.run(wave(info["url"]))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    check(run, info, during, again, victim["te"])
