"""`deepserve replay whatif` on a live daemon's run directory (issue 32 §1's acceptance): a
`kill-te` under load, then the run re-simulated in virtual time under another routing policy —
both columns printed, the original's request count the daemon's, the kill replayed (its admin
input) and the killed TE replaced in the what-if too. In-process and `--processes`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from cliproc import in_process
from daemonproc import start_daemon, stop_daemon
from test_retry_unstreamed import MODEL, REQUESTS, SETTINGS, TOKENS, ask, cli


def wait_inflight(admin_url: str, n: int, timeout_s: float = 60.0) -> None:
    """Until `n` requests are in flight (in both modes; a TE process's own load is not shown)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if httpx.get(admin_url + "/admin/status", timeout=10).json()["inflight"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"fewer than {n} requests in flight after {timeout_s} s")


async def load(url: str, admin_url: str) -> list[object]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)

    async def kill() -> subprocess.CompletedProcess[str]:
        await asyncio.to_thread(wait_inflight, admin_url, REQUESTS // 2)
        return await asyncio.to_thread(cli, "fault", "kill-te", "te/1", "--admin-url", admin_url)

    k = asyncio.create_task(kill())
    out = await asyncio.gather(*(ask(c, i) for i in range(REQUESTS)))
    assert (await k).returncode == 0
    return list(out)


@pytest.mark.parametrize("mode", [(), ("--processes",)], ids=["in-process", "processes"])
def test_whatif_on_a_daemon_run_dir_with_a_kill(tmp_path: Path, mode: tuple[str, ...]) -> None:
    run_dir = tmp_path / "run"
    proc, info = start_daemon(run_dir, *mode, *[a for s in SETTINGS for a in ("--set", s)])
    try:
        answers = asyncio.run(load(info["url"], info["admin_url"]))
        served = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()["requests"]
        if not mode:  # a scaling action by hand (an admin input): counted in both columns
            down = cli("scale", "llama3-8b/colocated", "2", "--admin-url", info["admin_url"])
            assert down.returncode == 0, down.stderr
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    assert len(answers) == REQUESTS and MODEL
    # answered by `main()` here (a subprocess would add a Python start and deepserve's imports)
    args = ["replay", "whatif", str(run_dir), "--set", "scheduling.policy=round_robin"]
    res = in_process(*args, "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    accepted = served["accepted"] + served["rejected_429"]
    assert got["mode"] == "daemon" and got["original"]["requests"] == accepted == REQUESTS
    assert got["whatif"]["requests"] == REQUESTS
    assert got["original"]["faults_injected"] == got["whatif"]["faults_injected"] == 1  # the kill-te
    assert got["original"]["scaling_actions"] == got["whatif"]["scaling_actions"] == (0 if mode else 1)
    assert got["whatif"]["recoveries"] == 1 and got["whatif"]["completed"] + got["whatif"]["failed"] == REQUESTS
    assert got["whatif"]["deliveries"] > 0 and TOKENS
    agreed = got["agreement"]  # the wall-clock run against its virtual re-run with no change
    assert agreed["requests"] == REQUESTS and agreed["routing_decisions"] >= REQUESTS
    assert 0 <= agreed["same_te"] <= agreed["routing_decisions"] and agreed["rerun"]["requests"] == REQUESTS
    text = in_process(*args, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "original" in text.stdout and "what-if" in text.stdout and "a daemon run" in text.stdout
    assert "against its virtual re-run with no change" in text.stdout
