"""`deepserve status` shows the pre-warmed pools (issue 34 acceptance: "deepserve status shows
pools"; DeepServe §6.1): with `[scaling]` on, the in-process pod launcher's pre-warmed pods,
SPMD masters and executors per server, in the text and in --json; a scale-out takes from them
and the status shows what is left; with `[scaling]` off there is no such key."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from daemonproc import start_daemon, stop_daemon, wait_for

GROUP = "llama3-8b/colocated"
FAST = ("cluster.tes=1", "control.spare_tes=1", "control.pod_start_s=0.2", "control.te_preload_s=0.3")
SCALING = ("scaling.enabled=true", "scaling.pod_pool=3", "scaling.master_pool=2", "scaling.executor_pool_per_server=2")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=60)


def ready(n: int) -> Any:
    return lambda s: s["groups"][GROUP]["ready"] == n and s["groups"][GROUP]["target"] == n


def test_status_shows_the_prewarmed_pools_and_a_scale_out_takes_from_them(tmp_path: Path) -> None:
    proc, info = start_daemon(tmp_path / "run", *[a for s in FAST + SCALING for a in ("--set", s)])
    admin = info["admin_url"]
    try:
        st = wait_for(admin, ready(1))
        before = st["prewarm"]
        assert before["policy"] == "fixed" and set(before) == {"policy", "pods", "masters", "executors"}
        shown = cli("status", "--admin-url", admin)
        assert shown.returncode == 0, shown.stderr
        execs = " ".join(f"{k} {v}" for k, v in before["executors"].items())
        line = f"pre-warmed (fixed): {before['pods']} pods, {before['masters']} masters, executors {execs}"
        assert line in shown.stdout, shown.stdout
        as_json = cli("status", "--json", "--admin-url", admin)
        assert as_json.returncode == 0 and json.loads(as_json.stdout)["prewarm"] == before
        assert cli("scale", GROUP, "2", "--admin-url", admin).returncode == 0
        # the new TE (TP 1) is packed from the pools: one master and one executor fewer, until
        # their refill's cold start (python + NPU + HCCL init) is over
        taken = wait_for(admin, lambda s: s["prewarm"]["masters"] < before["masters"])["prewarm"]
        assert taken["masters"] == before["masters"] - 1, (before, taken)
        assert sum(taken["executors"].values()) == sum(before["executors"].values()) - 1, (before, taken)
        assert wait_for(admin, ready(2))["groups"][GROUP]["ready"] == 2
    finally:
        stop_daemon(proc)


def test_without_scaling_the_status_has_no_prewarm_key(tmp_path: Path) -> None:
    proc, info = start_daemon(tmp_path / "run", *[a for s in FAST for a in ("--set", s)])
    try:
        st = wait_for(info["admin_url"], ready(1))
        assert "prewarm" not in st
        shown = cli("status", "--admin-url", info["admin_url"])
        assert shown.returncode == 0 and "pre-warmed" not in shown.stdout
    finally:
        stop_daemon(proc)
