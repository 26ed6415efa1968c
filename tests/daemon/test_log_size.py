"""The daemon's log per served request (issue 30 §1: <= 4 KB, with nothing less replayable). Its
writer stores each flush window's steps as one zstd page (`persistence/sqlite/page_store.py`,
`runtime.LOG_FLUSH_S`). Measured here (one TE, concurrency 16, 2026-11-29): 15,949 bytes a request
in rows before, 1,024 in pages; `deepserve up`'s default cluster over HTTP: 33 KB -> 2.6 KB. The
bound is that measurement with 2.5x margin: a regression to rows crosses it. The log still
verifies, closes cleanly and passes its integrity check."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from inproc import FAST, load, quiet, started

from deepserve.benchmarks.http_cost import log_bytes
from deepserve.persistence import open_log
from deepserve.replay import verify

WARM, REQUESTS, CONCURRENCY, TOKENS = 16, 160, 16, 16
BOUND_BYTES_PER_REQUEST = 2560  # measured 1,024 (module docstring); issue 30's target is 4,096


async def _run(run_dir: Path) -> tuple[int, Path]:
    rt, _ = await started(run_dir, *FAST)
    try:
        await load(rt, WARM, CONCURRENCY, TOKENS)
        rt._sink.flush()  # noqa: SLF001 — the measurement starts from what is committed
        before = log_bytes(rt.log_path)
        done = await load(rt, REQUESTS, CONCURRENCY, TOKENS)
        assert [(got, d.status) for got, d in done] == [(TOKENS, "completed")] * REQUESTS
        rt._sink.flush()  # noqa: SLF001
        return log_bytes(rt.log_path) - before, rt.log_path
    finally:
        await rt.stop(2.0)


def test_the_daemon_logs_at_most_4_kb_a_served_request_and_replays(tmp_path: Path) -> None:
    with quiet():
        grown, log_path = asyncio.run(_run(tmp_path / "run"))
    per_request = grown / REQUESTS
    assert per_request < BOUND_BYTES_PER_REQUEST, f"{per_request:.0f} bytes of log a request"
    with sqlite3.connect(log_path) as db:
        assert db.execute("SELECT count(*) FROM inputs").fetchone()[0] == 0  # all in pages
    log = open_log(str(log_path))
    try:
        assert verify(log).identical
        assert log.run_end().closed  # closed cleanly at stop: its closing record agrees
        log.check_integrity()
    finally:
        log.close()
