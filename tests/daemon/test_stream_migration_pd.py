"""Request migration with stream continuation in a P/D cluster (issue 33, xLLM §3.5), on a live
`deepserve up` through the official `openai` client: 10 concurrent streamed chat completions
(max_tokens 200, ignore_eos) on one prefill and two decode TEs; the decode TE serving them is
killed mid-stream (`deepserve fault kill-te`), and every stream still finishes normally with
exactly 200 completion tokens, its text the very text an undisturbed run streams. Each moved
request gets a new prefill of its prompt and the tokens the client has (`replay why`: resumed at
the frontend's position), then a decode continuing from there."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
from daemonproc import start_daemon, stop_daemon
from test_stream_migration import STREAMS, check, cli, serving, wave

from deepserve.actors.flowserve.master.state import TaskQueued
from deepserve.actors.je.migration import TaskMigrated
from deepserve.core import decode
from deepserve.persistence import open_log

COLOCATED = "llama3-8b/colocated"
PD = ("control.pod_start_s=0.2", "control.te_preload_s=0.3", "cluster.tes=1", "pd.prefill_tes=1",
      "pd.decode_tes=2", "control.spare_tes=0", "control.heartbeat_interval_s=0.25",
      "control.heartbeat_misses=3")  # fmt: skip


def test_kill_the_decode_te_mid_stream_every_stream_resumes_and_finishes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, info = start_daemon(run, *[a for s in PD for a in ("--set", s)])
    victim: dict[str, Any] = {}
    try:
        # P/D only: the colocated group (at least one TE at start) scaled to none first
        assert cli("scale", COLOCATED, "0", "--admin-url", info["admin_url"]).returncode == 0
        end = time.monotonic() + 60
        while time.monotonic() < end:
            st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
            if all(g["ready"] == g["target"] for g in st["groups"].values()) and st["groups"][COLOCATED]["ready"] == 0:
                break
            time.sleep(0.1)

        def kill() -> Any:
            victim.update(serving(info["admin_url"]))
            return cli("fault", "kill-te", victim["te"], "--admin-url", info["admin_url"])

        during, killed = asyncio.run(wave(info["url"], kill))
        assert killed.returncode == 0, killed.stderr
        assert victim["role"] == "decode", victim
        again, _ = asyncio.run(wave(info["url"]))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    # the two decode TEs share the streams (P/D routing has no prefix to follow): half move
    check(run, info, during, again, victim["te"], moved_at_least=STREAMS // 2)
    log, resumed = open_log(str(run)), 0
    try:
        for rid, *_ in during:
            events = [decode(e.type, e.payload) for st in log.steps(None, corr=rid) for e in st.events]
            moves = [e for e in events if isinstance(e, TaskMigrated)]
            if not moves:
                continue
            n = moves[0].resume_from
            queued = {e.task.kind: e for e in events if isinstance(e, TaskQueued) and e.task.resume_from}
            # a new prefill of the prompt and the n tokens the client has, emitting token n, then
            # a decode of its KV continuing from n + 1 — no restart from token 0
            assert queued["prefill"].task.resume_from == n and queued["prefill"].out_len == n + 1, rid
            assert queued["decode"].task.resume_from == n and queued["decode"].emitted == n + 1, rid
            resumed += 1
    finally:
        log.close()
    assert resumed >= len(during) // 2
