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

START_TIMEOUT_S = 60


def start_daemon(run_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "deepserve", "up", "--port", "0", "--run-dir", str(run_dir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    info_path = run_dir / "daemon.json"
    end = time.monotonic() + START_TIMEOUT_S
    while not info_path.exists():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"the daemon did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.05)
    return proc, json.loads(info_path.read_text())


def stop_daemon(proc: subprocess.Popen[str], timeout_s: float = 30) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout_s)
    return out


