"""A non-streamed request whose TE dies mid-generation is retried (a user tour: `kill-te` during
load answered such requests `503 the request failed after 59 output tokens: chat task failed
after output streamed`, though the client had been sent nothing). The answer is the retry's
alone — its text and usage, not two attempts joined — and the log replays identically."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon

from deepserve.core.codec import decode
from deepserve.persistence import open_log
from deepserve.replay import verify

MODEL = "llama3-8b"
SETTINGS = ("control.heartbeat_interval_s=0.25", "control.heartbeat_misses=3", "control.pod_start_s=0.2",
            "control.te_preload_s=0.3", "pd.prefill_tes=0", "pd.decode_tes=0")  # fmt: skip
REQUESTS = 8
TOKENS = 200


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=60)


def wait_running(admin_url: str, te: str, timeout_s: float = 60.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        st = httpx.get(admin_url + "/admin/status", timeout=10).json()
        if any(dp.get("running", 0) for t in st["tes"] if t["te"] == te for dp in t["dps"]):
            return
        time.sleep(0.02)
    raise AssertionError(f"{te} ran none of the requests in {timeout_s} s")


async def ask(c: Any, i: int) -> tuple[int, str, int] | str:
    try:
        r = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"tell me a story {i} " * 6}],
            max_tokens=TOKENS, seed=1000 + i, extra_body={"ignore_eos": True})  # fmt: skip
        return i, r.choices[0].message.content or "", r.usage.completion_tokens
    except openai.APIStatusError as exc:
        return f"{exc.status_code}: {exc.message}"


async def load(url: str, admin_url: str) -> tuple[list[Any], list[Any]]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)

    async def kill() -> subprocess.CompletedProcess[str]:
        # Once te/1 runs its share, its first tokens are one prefill of ~30 tokens away and its
        # last ones seconds away: the kill (a process start) lands between. (A fixed 0.4 s from
        # the first request assumed the daemon had taken the requests in by then.)
        await asyncio.to_thread(wait_running, admin_url, "te/1")
        return await asyncio.to_thread(cli, "fault", "kill-te", "te/1", "--admin-url", admin_url)

    k = asyncio.create_task(kill())
    during = await asyncio.gather(*(ask(c, i) for i in range(REQUESTS)))
    killed = await k
    assert killed.returncode == 0, killed.stderr
    again = await asyncio.gather(*(ask(c, i) for i in range(REQUESTS)))  # the same requests, undisturbed
    return list(during), list(again)


def test_a_non_streamed_request_is_retried_after_its_te_dies(tmp_path: Path) -> None:
    proc, info = start_daemon(tmp_path / "run", *[a for s in SETTINGS for a in ("--set", s)])
    try:
        during, again = asyncio.run(load(info["url"], info["admin_url"]))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    errors = [r for r in during if isinstance(r, str)]
    assert not errors, errors  # none failed: nothing had reached their clients
    for (i, text, n), (_, text2, n2) in zip(during, again, strict=True):
        assert n == n2 == TOKENS, (i, n, n2)
        assert text == text2, i  # the retry's text only (same seed: the same text)
    log = open_log(info["log"])
    try:
        assert verify(log).identical
        je = [(e.type, decode(e.type, e.payload)) for step in log.steps(None, actor="je/0") for e in step.events]
        # what the TEs streamed to the frontend (a non-streaming job's JE hears of no chunk)
        streamed = {c.task_id for step in log.steps(None) for o in step.outputs if o.type == "TokenBatch"
                    for c in decode(o.type, o.payload).chunks}  # type: ignore[attr-defined]
        retried = [e for t, e in je if t == "RouteDecided" and e.attempt > 1]
        # a retry of a task that had produced output before its TE died
        assert any(f"{e.request_id}/chat.{e.attempt - 1}" in streamed for e in retried), retried
    finally:
        log.close()
