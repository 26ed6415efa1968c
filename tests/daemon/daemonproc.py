"""Start and stop a live `deepserve up` (a subprocess on a free loopback port)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

START_TIMEOUT_S = 60


def start_daemon(run_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    out = open(f"{run_dir}.out", "w")  # a file, not a pipe: a full pipe would block the daemon
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepserve", "up", "--port", "0", "--run-dir", str(run_dir), *extra],
        stdout=out, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    out.close()  # the child holds its own descriptor
    proc.out_path = f"{run_dir}.out"  # type: ignore[attr-defined]
    info_path = run_dir / "daemon.json"
    end = time.monotonic() + START_TIMEOUT_S
    while not info_path.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"the daemon did not start: {open(f'{run_dir}.out').read()}")
        time.sleep(0.05)
    return proc, json.loads(info_path.read_text())


def stop_daemon(proc: subprocess.Popen[str], timeout_s: float = 30) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=timeout_s)
    with open(proc.out_path) as f:  # type: ignore[attr-defined]
        return f.read()


async def stream_story(client: Any, model: str, i: int, max_tokens: int) -> tuple[str, str]:
    """One streamed chat through the `openai` client: ("finished", finish_reason),
    ("error", "status: message") when the daemon answered with an error before any token, or
    ("aborted", message) when the stream was cut after output (the daemon's in-band error)."""
    import openai

    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"tell me a story {i} " * 6}],
            max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})  # fmt: skip
        finish = ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        return ("finished", finish)
    except openai.APIStatusError as exc:
        return ("error", f"{exc.status_code}: {exc.message}")
    except openai.APIError as exc:  # an error event mid-stream: the client raises it
        return ("aborted", exc.message)


def admin_status(admin: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The daemon's `/admin/status` (`headers`: its admin token, when set)."""
    return httpx.get(admin + "/admin/status", headers=headers, timeout=10).json()  # type: ignore[no-any-return]


def wait_for(admin: str, pred: Any, timeout_s: float = 60.0, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Poll the status until `pred(status)` holds or `timeout_s` passes; the last status either way
    (the caller's assertion says which)."""
    end = time.monotonic() + timeout_s
    while True:
        st = admin_status(admin, headers)
        if pred(st) or time.monotonic() > end:
            return st
        time.sleep(0.1)
