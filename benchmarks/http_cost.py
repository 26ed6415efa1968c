"""`deepserve bench http`'s cost rows (issue 30 §1): what the platform itself costs a request —
server CPU, log bytes, memory — beside bare servers streaming the same number of tokens at the same
emulated pace, measured in the same run. Two baselines: the one issue 30 names, a bare FastAPI/uvicorn
SSE server (`http_bare_fastapi.py`: a FastAPI route returning a StreamingResponse of OpenAI-shaped
chunks, as vLLM's server is built), and a stricter one, raw ASGI with no framework (`http_bare.py`);
the `_vs_asgi` rows compare the daemon with the latter.

The three servers run as subprocesses on loopback side by side; the load goes to each in turn, the
order rotating every round (round r starts with server r mod 3), so a neighbour's load on a shared
machine falls on all of them. Each load window's CPU is the server
process's own (user + system, all its threads: the daemon's log writer is one), read from
/proc/<pid>/stat around the window; the median of the rounds is reported, and the spread
(max - min) in a `_spread` row beside it. Log bytes are the daemon log's live pages (SQLite
`page_count - freelist_count`, WAL included: a read transaction sees it) around each window, less
the idle rate over the window's length; the idle rate is measured after the load, once the
heartbeats have backed off (`control.heartbeat_idle_max_interval_s`). RSS growth is the
daemon's resident set after the warm-up (`--warm-up`, `WARM_UP_REQUESTS`) against after the last round.
Linux only (/proc)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2 as httpx

from deepserve.benchmarks.table import Row

START_TIMEOUT_S = 60
CONCURRENCIES = (16, 64)
# Before the windows: the daemon's bounded caches (the log writer's page cache, the actors' events
# since their last snapshots, prefix caches) fill, so RSS growth after it is growth. Measured (issue
# 30 §1, 1,000-request windows at concurrency 64): RSS rose ~3.4 MB a window up to ~5,000 requests,
# then ~0.2 MB; after 1,024 the row read ~4.6 MB per 1,000 requests: filling, not a leak.
WARM_UP_REQUESTS = 6000
IDLE_SETTLE_S = 65.0  # heartbeat backoff 1 -> 60 s: ticks at 1, 3, 7, 15, 31, 63 s, then every 60 s
TICKS_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS_S  # utime, stime (fields 14, 15)


def rss_kb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE / 1024


def log_bytes(db: Path) -> int:
    """The log's live bytes (pages in use, WAL included)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        pc, free, size = (con.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
    finally:
        con.close()
    return int((pc - free) * size)


async def load(url: str, model: str, requests: int, concurrency: int, tokens: int) -> tuple[int, list[float], list[float]]:
    """`requests` streamed completions, `concurrency` at a time: (errors, emulated TTFTs, TPOTs)."""
    body = {"model": model, "prompt": "benchmark prompt " * 8, "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    todo = list(range(requests))
    errors, ttft, tpot = 0, [], []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            while todo:
                todo.pop()
                emulated: dict[str, Any] = {}
                async with client.stream("POST", url, json=body) as r:
                    if r.status_code != 200:
                        errors += 1
                        await r.aread()
                        continue
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            emulated = json.loads(line[6:]).get("deepserve", emulated)
                if emulated.get("ttft_s") is None:
                    errors += 1
                    continue
                ttft.append(emulated["ttft_s"])
                if emulated.get("tpot_s") is not None:
                    tpot.append(emulated["tpot_s"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return errors, ttft, tpot


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited at start")
        try:
            if check():
                return
        except (OSError, ValueError, httpx.TransportError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {START_TIMEOUT_S} s")


class Servers:
    """The daemon and the bare servers, up side by side."""

    def __init__(self, tmp: Path) -> None:
        self.run_dir = tmp / "run"
        self.daemon = _start(["-m", "deepserve", "up", "--port", "0", "--run-dir", str(self.run_dir), "--log-format", "json"])
        info_path = self.run_dir / "daemon.json"
        _wait(info_path.exists, self.daemon, "the daemon")
        info = json.loads(info_path.read_text())
        self.daemon_url = info["url"] + "/v1/completions"
        self.db = Path(info["log"])
        self.model = httpx.get(info["url"] + "/v1/models").json()["data"][0]["id"]
        self.procs: dict[str, subprocess.Popen[bytes]] = {"daemon": self.daemon}
        self.urls = {"daemon": self.daemon_url}

    def start_bare(self, ttft_s: float, tpot_s: float, ports: tuple[int, int]) -> None:
        """Both baselines, paced by the daemon's emulated TTFT and TPOT."""
        env = {**os.environ, "BARE_TTFT_S": str(ttft_s), "BARE_TPOT_S": str(tpot_s)}
        for which, port in zip(BARES, ports, strict=True):
            proc = self.procs[which] = _start(["-m", "uvicorn", BARES[which][0], "--port", str(port),
                                               "--log-level", "warning", "--no-access-log"], env)  # fmt: skip
            root = f"http://127.0.0.1:{port}/"
            self.urls[which] = root + BARES[which][1]
            _wait(lambda root=root: httpx.get(root, timeout=1) is not None, proc, f"the {which} server")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(60)


# The baselines: the ASGI app each runs and the path it streams completions at.
BARES = {"bare-fastapi": ("deepserve.benchmarks.http_bare_fastapi:app", "v1/completions"),
         "bare-asgi": ("deepserve.benchmarks.http_bare:app", "")}  # fmt: skip
SERVERS = ("daemon", *BARES)


def _window(srv: Servers, which: str, requests: int, c: int, tokens: int) -> tuple[float, int, int]:
    """One load window on one server: (CPU seconds, log bytes added, errors)."""
    proc = srv.procs[which]
    b0, c0 = log_bytes(srv.db), cpu_s(proc.pid)
    errors, _, _ = asyncio.run(load(srv.urls[which], srv.model, requests, c, tokens))
    cpu = cpu_s(proc.pid) - c0
    return cpu, log_bytes(srv.db) - b0 if which == "daemon" else 0, errors


def cost_bench(requests: int, tokens: int, rounds: int, idle_s: float, progress: Callable[[str], None],
               ports: tuple[int, int], warm_up: int = WARM_UP_REQUESTS) -> list[Row]:  # fmt: skip
    """The cost rows; `ports`: two free loopback ports for the bare servers."""
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-cost-") as tmp:
        srv = Servers(Path(tmp))
        try:
            return _measure(srv, requests, tokens, rounds, idle_s, progress, ports, warm_up)
        finally:
            srv.close()


def _measure(srv: Servers, requests: int, tokens: int, rounds: int, idle_s: float,
             progress: Callable[[str], None], ports: tuple[int, int], warm_up: int) -> list[Row]:  # fmt: skip
    progress(f"cost: warming the daemon up, {warm_up} requests (its emulated TTFT and TPOT pace the bare server)")
    errors, ttft, tpot = asyncio.run(load(srv.daemon_url, srv.model, warm_up, max(CONCURRENCIES), tokens))
    srv.start_bare(statistics.median(ttft) if ttft else 0.02, statistics.median(tpot) if tpot else 0.02, ports)
    for which in BARES:  # their first requests (imports, caches) are not a window's
        asyncio.run(load(srv.urls[which], srv.model, max(CONCURRENCIES), max(CONCURRENCIES), tokens))
    rss0 = {w: rss_kb(p.pid) for w, p in srv.procs.items()}
    cpu: dict[tuple[str, int], list[float]] = {}
    log: dict[int, list[float]] = {}
    total = 0
    for r in range(rounds):
        for c in CONCURRENCIES:
            order = SERVERS[r % 3 :] + SERVERS[: r % 3]
            for which in order:
                progress(f"cost: round {r + 1}/{rounds}, {which}, {requests} requests x {tokens} tokens, concurrency {c}")
                s, nbytes, e = _window(srv, which, requests, c, tokens)
                errors += e
                cpu.setdefault((which, c), []).append(1e3 * s / requests)
                if which == "daemon":
                    log.setdefault(c, []).append(nbytes)
                    total += requests
    rss1 = {w: rss_kb(p.pid) for w, p in srv.procs.items()}
    idle_rate = _idle_rate(srv, idle_s, progress)
    rows = []
    for c in CONCURRENCIES:
        d, f, a = cpu[("daemon", c)], cpu[("bare-fastapi", c)], cpu[("bare-asgi", c)]
        name = f"server_cpu_ms_per_request_c{c}"
        rows.append(Row(name, statistics.median(d), "ms", "bare FastAPI SSE", statistics.median(f)))
        rows.append(Row(f"{name}_vs_asgi", statistics.median(d), "ms", "bare ASGI SSE", statistics.median(a)))
        rows.append(Row(f"{name}_spread", max(d) - min(d), "ms", "bare FastAPI SSE", max(f) - min(f)))
    for c in CONCURRENCIES:  # everything logged in the window (its heartbeats too), a request
        per = [n / requests for n in log[c]]
        rows.append(Row(f"log_bytes_per_request_c{c}", statistics.median(per), "bytes", "target", 4096.0))
    if not math.isnan(idle_rate):  # measured (--idle-s long enough)
        rows.append(Row("log_bytes_per_idle_hour", idle_rate * 3600, "bytes", "target", 1e6))
    rows.append(Row("rss_growth_kb_per_1k_requests", (rss1["daemon"] - rss0["daemon"]) / total * 1000, "KB",
                    "bare FastAPI SSE", (rss1["bare-fastapi"] - rss0["bare-fastapi"]) / total * 1000))  # fmt: skip
    rows.append(Row("cost_errors", float(errors), "requests", None, None))
    return rows


def _idle_rate(srv: Servers, idle_s: float, progress: Callable[[str], None]) -> float:
    """Log bytes a second with no request, once the heartbeats have backed off (NaN: skipped)."""
    if idle_s <= IDLE_SETTLE_S:
        return float("nan")
    progress(f"cost: the daemon idle for {idle_s:g} s (log bytes over the last {idle_s - IDLE_SETTLE_S:g} s)")
    time.sleep(IDLE_SETTLE_S)
    b0, t0 = log_bytes(srv.db), time.monotonic()
    time.sleep(idle_s - IDLE_SETTLE_S)
    return (log_bytes(srv.db) - b0) / (time.monotonic() - t0)


def add_cost_args(p: Any) -> None:
    """`bench http`'s flags for the cost rows."""
    from deepserve.cmdline import in_range, positive_int

    p.add_argument("--cost-rounds", type=in_range(int, 0, 100, "an integer"), default=3, metavar="R",
                   help="rounds of the cost rows (daemon and both bare servers in turn), at concurrency 16 and 64 (0: no cost rows)")
    p.add_argument("--cost-requests", type=positive_int, default=320, metavar="N", help="requests a cost window")
    p.add_argument("--warm-up", type=positive_int, default=WARM_UP_REQUESTS, metavar="N",
                   help=f"requests before the cost windows, so the daemon's bounded caches are full (default {WARM_UP_REQUESTS})")
    p.add_argument("--idle-s", type=in_range(float, 0, 86_400, "seconds"), default=185.0, metavar="S",
                   help=f"idle time for log_bytes_per_idle_hour, the first {IDLE_SETTLE_S:g} s not counted (<= that: skipped)")


def cost_rows(args: Any, progress: Callable[[str], None]) -> list[Row]:
    """The cost rows `args` ask for (none with --cost-rounds 0)."""
    if args.cost_rounds <= 0:
        return []
    import socket

    with socket.socket() as one, socket.socket() as two:
        one.bind(("127.0.0.1", 0))
        two.bind(("127.0.0.1", 0))
        ports = (int(one.getsockname()[1]), int(two.getsockname()[1]))
    return cost_bench(args.cost_requests, args.tokens, args.cost_rounds, args.idle_s, progress, ports, args.warm_up)
