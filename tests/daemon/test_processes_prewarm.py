"""`deepserve up --processes` with `[scaling]` (issue 34: pre-warming, warm-up and NPU-fork in
processes mode; DeepServe §6.1–6.2). A pre-warmed TE is a real OS process that did its Python
start-up and waits unassigned: a scale-out claims it (its pid existed before the scale-out), the
recorded steps say TE-Pre-Load came from the pool and TE-Load was an NPU-fork from the running TE
(over the emulated fabric, not the host path), the dummy-request warm-up ran in the new process
before it registered, the Python start is a measured step of its own, and the pool refills with a
new process. `deepserve status` shows the pools. The run replays, each log on its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemonproc import start_daemon, stop_daemon, wait_for

import deepserve.actors.cluster.state  # noqa: F401  (registers the manager's event types for decode)
from deepserve.core.codec import decode
from deepserve.persistence import open_log

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
GROUP = "llama3-8b/colocated"
SETTINGS = ("cluster.tes=1", "control.spare_tes=1", "control.te_preload_s=0.3", "scaling.enabled=true",
            "scaling.pod_pool=1", "scaling.master_pool=1", "scaling.executor_pool_per_server=1",
            "scaling.fork=true")  # fmt: skip


def warm_pids(st: dict[str, Any]) -> list[int]:
    return [w["pid"] for w in st.get("prewarm", {}).get("warm_processes", [])]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def steps_of(run_dir: Path, te: str) -> dict[str, tuple[float, str]]:
    """The manager's recorded boot steps of `te` (generation 1): step -> (seconds, detail)."""
    log = open_log(str(run_dir / "daemon.db"))
    try:
        evs = [decode(e.type, e.payload) for s in log.steps(None, actor="cluster") for e in s.events
               if e.type == "TeStepDone"]  # fmt: skip
    finally:
        log.close()
    return {e.step: (e.duration_s, e.detail) for e in evs if e.te == te and e.generation == 1}


def test_a_scale_out_claims_a_prewarmed_process_forks_and_the_pool_refills(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, info = start_daemon(run_dir, "--processes", *[a for s in SETTINGS for a in ("--set", s)])
    admin = info["admin_url"]
    try:
        st = wait_for(admin, lambda s: warm_pids(s) and s["groups"][GROUP]["ready"] == 1)
        assert st["mode"] == "processes" and st["groups"][GROUP]["ready"] == 1, st["groups"]
        (warm,) = warm_pids(st)
        assert alive(warm) and warm not in {p["pid"] for p in st["processes"]}, (warm, st["processes"])
        assert st["prewarm"]["masters"] == 1 and st["prewarm"]["pods"] == 1, st["prewarm"]
        shown = subprocess.run([sys.executable, "-m", "deepserve", "status", "--admin-url", admin],
                               capture_output=True, text=True, timeout=60)  # fmt: skip
        assert "pre-warmed (fixed): 1 pods, 1 masters" in shown.stdout, shown.stdout + shown.stderr
        assert subprocess.run([sys.executable, "-m", "deepserve", "scale", GROUP, "2", "--admin-url", admin],
                              capture_output=True, timeout=60).returncode == 0  # fmt: skip
        st = wait_for(admin, lambda s: s["groups"][GROUP]["ready"] == 2)
        new = next(t for t in st["tes"] if t["group"] == GROUP and t["te"] != "te/0")
        assert new["state"] == "ready" and new["pid"] == warm, (warm, new)  # the pre-warmed process is the TE
        # the pool refills: a new pre-warmed process (the executors' modeled refill comes later)
        st = wait_for(admin, lambda s: warm_pids(s) and warm not in warm_pids(s))
        assert warm_pids(st) and warm not in warm_pids(st) and alive(warm_pids(st)[0]), st["prewarm"]
    finally:
        stop_daemon(proc)
    assert not alive(warm_pids(st)[0])  # the daemon's stop ends the unclaimed process too
    steps = steps_of(run_dir, new["te"])
    assert steps["scaler_pre"][1] == "pre-warmed pod", steps
    assert steps["te_pre_load"][1].startswith("pre-warmed:"), steps
    assert steps["te_load"][1].startswith("npu-fork-hccs from te/0"), steps  # te/0 shares its server
    assert "warm-up: 1 dummy request per DP group" in steps["te_post_load"][1], steps
    python_s, how = steps["python_start"]
    assert how.startswith(f"real: pre-warmed process pid {warm}") and 0 < python_s < 30, steps
    v = subprocess.run([sys.executable, "-m", "deepserve", "replay", "verify", str(run_dir)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert v.returncode == 0 and v.stdout.startswith("identical: "), v.stdout + v.stderr


def test_without_a_prewarmed_process_the_python_start_is_measured_cold(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cold = [s for s in SETTINGS if "_pool" not in s and "fork" not in s]
    proc, info = start_daemon(run_dir, "--processes", *[a for s in cold for a in ("--set", s)])
    admin = info["admin_url"]
    try:
        st = wait_for(admin, lambda s: s["groups"][GROUP]["ready"] == 1)
        assert st["prewarm"]["masters"] == 0 and warm_pids(st) == [], st["prewarm"]
        assert subprocess.run([sys.executable, "-m", "deepserve", "scale", GROUP, "2", "--admin-url", admin],
                              capture_output=True, timeout=60).returncode == 0  # fmt: skip
        st = wait_for(admin, lambda s: s["groups"][GROUP]["ready"] == 2)
        assert st["groups"][GROUP]["ready"] == 2, st["groups"]
        new = next(t for t in st["tes"] if t["group"] == GROUP and t["te"] != "te/0")
    finally:
        stop_daemon(proc)
    steps = steps_of(run_dir, new["te"])
    python_s, how = steps["python_start"]
    assert how == f"real: cold process pid {new['pid']}" and 0 < python_s < 30, steps
    assert steps["te_pre_load"][1].startswith("cold: python start real (step python_start) + NPU init"), steps
    assert steps["te_load"][1].startswith("dram-"), steps  # no fork: from the host's page cache or SSD
    assert os.path.exists(run_dir / "daemon.db")
