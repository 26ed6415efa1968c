"""`deepserve up --processes` keeps its run the user's alone (issue 29 §1): the run directory
0700; the main log, each TE process's log and their SQLite -wal/-shm files 0600 (the TE processes
inherit the daemon's umask), even when started under a umask of 0; and the token (from the
environment) in no file, no output, no command line, nor the TE processes' environment."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import httpx2 as httpx
import pytest
from daemonproc import start_daemon, stop_daemon

from deepserve.persistence import open_log

TOKEN = "procs-token-81c7"
SETTINGS = ("cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0", "control.spare_tes=0",
            "control.te_preload_s=0.2")  # fmt: skip
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_processes_mode_files_are_the_users_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSERVE_ADMIN_TOKEN", TOKEN)
    old = os.umask(0)  # the daemon's files must not depend on the caller's umask (inherited)
    try:
        run_dir = tmp_path / "run"
        proc, info = start_daemon(run_dir, "--processes", *[a for s in SETTINGS for a in ("--set", s)])
    finally:
        os.umask(old)
    try:
        end = time.monotonic() + 60
        while True:  # the TE process is up and has written its log
            st = httpx.get(info["admin_url"] + "/admin/status", headers=AUTH, timeout=10).json()
            if [t["state"] for t in st["tes"]] == ["ready"] or time.monotonic() > end:
                break
            time.sleep(0.1)
        assert [t["state"] for t in st["tes"]] == ["ready"], st
        # Not in any command line (/proc/<pid>/cmdline: readable by every user); the daemon drops it
        # from its environment once read, so its TE processes do not inherit it (the daemon's own
        # /proc/<pid>/environ keeps its start environment, readable by the user alone).
        te_pid = st["tes"][0]["pid"]
        for pid in (proc.pid, te_pid):
            assert TOKEN.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
        assert TOKEN.encode() not in Path(f"/proc/{te_pid}/environ").read_bytes()
        assert mode(run_dir) == 0o700
        files = sorted(p for p in run_dir.iterdir())
        names = {p.name for p in files}
        assert {"daemon.db", "daemon.json", "te-0-g1.db"} <= names, names
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    assert TOKEN not in out
    for p in run_dir.iterdir():
        assert mode(p) == 0o600 and TOKEN.encode() not in p.read_bytes(), p
    log = open_log(info["log"])
    try:
        assert json.loads(log.runs()[-1].config)["daemon"]["admin_token"] == "<redacted>"
    finally:
        log.close()
