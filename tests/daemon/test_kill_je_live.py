"""`deepserve fault kill-je` on a live daemon (issue 33, zombie protection): two JEs, streams
through the official `openai` client; the JE holding some of them is killed mid-stream. With
request migration on (the daemon's default) the gateway moves the lost JE's streaming jobs to the
other JE, which resumes each at its client's position: every stream finishes with all its tokens,
its text the undisturbed run's, and `replay why` says the gateway moved it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import openai
from cliproc import in_process
from daemonproc import start_daemon, stop_daemon

MODEL = "llama3-8b"
STREAMS = 8
TOKENS = 120
MID_CHUNKS = 6
SETS = ("control.pod_start_s=0.2", "control.te_preload_s=0.3", "pd.prefill_tes=0", "pd.decode_tes=0",
        "cluster.tes=2", "control.spare_tes=0", "scheduling.jes=2")  # fmt: skip
PROMPT = "write a long letter from a lighthouse keeper to the sea " * 6


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=120)


async def one(c: openai.AsyncOpenAI, i: int, progress: list[int]) -> tuple[str, str, str, int]:
    raw = await c.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS, seed=9100 + i,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})  # fmt: skip
    text, finish, used = "", "", -1
    async for chunk in raw.parse():
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            progress[i] += bool(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            used = chunk.usage.completion_tokens
    return raw.headers["x-request-id"], text, finish, used


async def wave(url: str, admin_url: str | None = None) -> tuple[list[tuple[str, str, str, int]], str]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    progress = [0] * STREAMS
    try:
        streams = [asyncio.create_task(one(c, i, progress)) for i in range(STREAMS)]
        said = ""
        if admin_url is not None:
            end = time.monotonic() + 60
            while min(progress) < MID_CHUNKS and time.monotonic() < end and not any(s.done() for s in streams):
                await asyncio.sleep(0.005)
            assert not any(s.done() for s in streams), "a stream ended before the kill"
            done = await asyncio.to_thread(cli, "fault", "kill-je", "je/0", "--admin-url", admin_url)
            assert done.returncode == 0, done.stderr
            said = done.stdout
        return list(await asyncio.wait_for(asyncio.gather(*streams), 150)), said
    finally:
        await c.close()


def test_kill_je_mid_stream_every_stream_moves_to_the_other_je_and_finishes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, info = start_daemon(run, *[a for s in SETS for a in ("--set", s)])
    try:
        bad = cli("fault", "kill-je", "je/7", "--admin-url", info["admin_url"])
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr
        assert "no JE 'je/7' (JEs: je/0, je/1)" in bad.stderr
        during, said = asyncio.run(wave(info["url"], info["admin_url"]))
        again, _ = asyncio.run(wave(info["url"]))  # je/0 is gone: all on je/1, undisturbed
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    for (rid, text, finish, used), (_, text2, _, _) in zip(during, again, strict=True):
        assert (finish, used) == ("length", TOKENS), (rid, finish, used)
        assert text == text2, rid  # no token twice, none skipped
    # answered by `main()` here: a Python start and deepserve's imports each as subprocesses
    moved = [rid for rid, *_ in during if "moved by the gateway" in in_process("replay", "why", str(run), rid,
                                                                                cwd=tmp_path).stdout]  # fmt: skip
    assert moved, "no stream was on je/0"  # the gateway draws a JE per request: 8 streams, two JEs
    assert in_process("replay", "verify", str(run), cwd=tmp_path).returncode == 0
