"""`deepserve bench http`: sustained requests/s through the daemon's OpenAI-compatible API and
the overhead the platform adds on top of the emulated NPU timings, beside a bare uvicorn SSE
endpoint (raw ASGI, `http_bare.py`) streaming the same number of tokens at the same pace (same run,
same client).

Overhead per request: client-observed TTFT − the request's emulated TTFT (from its recorded
terminal state, returned in the final SSE chunk), and each client-observed inter-chunk gap − the
request's emulated TPOT. Both servers run as subprocesses on loopback; the client is httpx2
(the openai client's transport) with `concurrency` streams in a closed loop.

A request that fails (an HTTP error status, an error in the stream, a cut connection) fails the
bench (`BenchFailed`): its numbers would time errors, not serving. The servers run in sessions of
their own, so a terminal's Ctrl-C reaches the bench alone, which stops them (`_stop`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2 as httpx

from deepserve.benchmarks.table import Row

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30  # a server that has not exited this long after SIGTERM is killed


class BenchFailed(Exception):
    """Requests of the bench failed; the message says how many and why (one line)."""


class Sample:
    def __init__(self) -> None:
        self.ttft_over_ms: list[float] = []
        self.gap_over_ms: list[float] = []
        self.emulated_ttft_s: list[float] = []
        self.emulated_tpot_s: list[float] = []
        self.errors = 0
        self.sent = 0
        self.reasons: Counter[str] = Counter()

    def fail(self, reason: str) -> None:
        self.errors += 1
        self.reasons[" ".join(reason.split())[:200]] += 1

    def check(self, server: str, requests: int) -> None:
        """Raise `BenchFailed` if any request failed (after the first, no more were sent)."""
        if not self.errors:
            return
        why = "; ".join(f"{n} x {reason}" for reason, n in self.reasons.most_common(3))
        unsent = f", {requests - self.sent} not sent" if self.sent < requests else ""
        raise BenchFailed(f"{self.errors} of {self.sent} requests to {server} failed{unsent}: {why}")


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], s: Sample) -> None:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    emulated: dict[str, Any] = {}
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                s.fail(f"HTTP {r.status_code}: {_message(await r.aread())}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:  # a failure after the first output, said in the stream
                    s.fail(f"in the stream: {_message(line[6:].encode())}")
                    return
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    arrivals.append(time.perf_counter())
                emulated = chunk.get("deepserve", emulated)
    except httpx.HTTPError as exc:  # a cut connection, a timeout
        s.fail(f"{type(exc).__name__}: {exc}")
        return
    status = emulated.get("status", "completed")
    if status != "completed" or not arrivals or not emulated.get("ttft_s"):
        s.fail(f"the request ended {status}" if status != "completed" else "the stream ended without its timings")
        return
    s.ttft_over_ms.append(1e3 * (arrivals[0] - t0 - emulated["ttft_s"]))
    s.emulated_ttft_s.append(emulated["ttft_s"])
    tpot = emulated.get("tpot_s")
    if tpot is not None:
        s.emulated_tpot_s.append(tpot)
        s.gap_over_ms.extend(1e3 * (b - a - tpot) for a, b in zip(arrivals, arrivals[1:], strict=False))


async def _load(url: str, model: str, requests: int, concurrency: int, tokens: int) -> tuple[Sample, float]:
    s = Sample()
    body = {"model": model, "prompt": "benchmark prompt " * 8, "max_tokens": tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
    queue = list(range(requests))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker() -> None:
            while queue and not s.errors:  # after a failure, the bench's answer is known
                queue.pop()
                s.sent += 1
                await _one(client, url, body, s)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return s, wall


def _message(body: bytes) -> str:
    """The OpenAI-format error's message of a response body, else the body's start."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace") or "(no body)"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a server and reap it. A second Ctrl-C or a SIGTERM waits meanwhile (blocked): one
    that interrupted the stop left an orphaned uvicorn."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise BenchFailed("the bare uvicorn endpoint exited at start")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise BenchFailed(f"{url} did not answer within {START_TIMEOUT_S} s")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


@contextmanager
def _interrupt_once() -> Iterator[None]:
    """The first Ctrl-C interrupts the bench; later ones are ignored until it has stopped its
    servers. (asyncio.run's own handler raises KeyboardInterrupt again on a second Ctrl-C, which
    could land between the first one's unwinding and `_stop`'s signal mask: an orphaned daemon.)"""
    interrupted = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def http_bench(requests: int, concurrency: int, tokens: int, progress: Callable[[str], None]) -> tuple[str, list[Row]]:
    with _interrupt_once():
        return _http_bench(requests, concurrency, tokens, progress)


def _http_bench(requests: int, concurrency: int, tokens: int, progress: Callable[[str], None]) -> tuple[str, list[Row]]:
    with tempfile.TemporaryDirectory(prefix="deepserve-bench-http-") as tmp:
        run_dir = Path(tmp) / "run"
        progress(f"the daemon: {requests} streamed requests x {tokens} tokens, {concurrency} at a time")
        proc = subprocess.Popen([sys.executable, "-m", "deepserve", "up", "--port", "0", "--run-dir", str(run_dir),
                                 "--log-format", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # fmt: skip
        try:
            end = time.monotonic() + START_TIMEOUT_S
            while not (run_dir / "daemon.json").exists():
                if proc.poll() is not None:
                    raise BenchFailed(f"the daemon exited at start (status {proc.returncode})")
                if time.monotonic() > end:
                    raise BenchFailed(f"the daemon did not start within {START_TIMEOUT_S} s")
                time.sleep(0.05)
            info = json.loads((run_dir / "daemon.json").read_text())
            try:
                model = httpx.get(info["url"] + "/v1/models").json()["data"][0]["id"]
            except httpx.HTTPError as exc:
                raise BenchFailed(f"the daemon did not list its model: {type(exc).__name__}: {exc}") from None
            d, d_wall = asyncio.run(_load(info["url"] + "/v1/completions", model, requests, concurrency, tokens))
        finally:
            _stop(proc)
    d.check("the daemon", requests)
    ttft = statistics.median(d.emulated_ttft_s) if d.emulated_ttft_s else 0.02
    tpot = statistics.median(d.emulated_tpot_s) if d.emulated_tpot_s else 0.02
    progress(f"bare ASGI SSE: same load, TTFT {ttft * 1e3:.1f} ms, TPOT {tpot * 1e3:.1f} ms (the daemon's medians)")
    port = _free_port()
    env = {**os.environ, "BARE_TTFT_S": str(ttft), "BARE_TPOT_S": str(tpot)}
    bare = subprocess.Popen([sys.executable, "-m", "uvicorn", "deepserve.benchmarks.http_bare:app", "--port", str(port),
                             "--log-level", "warning", "--no-access-log"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        _wait_http(f"http://127.0.0.1:{port}/", bare)
        b, b_wall = asyncio.run(_load(f"http://127.0.0.1:{port}/", "bare", requests, concurrency, tokens))
    finally:
        _stop(bare)
    b.check("the bare uvicorn endpoint", requests)
    rows = [Row("http_req_per_s", requests / d_wall, "req/s", "bare ASGI SSE", requests / b_wall)]
    for name, xs, bx in (("ttft_overhead_ms", d.ttft_over_ms, b.ttft_over_ms),
                         ("itl_overhead_ms", d.gap_over_ms, b.gap_over_ms)):  # fmt: skip
        for q, tag in ((0.5, "p50"), (0.99, "p99")):
            rows.append(Row(f"{name}_{tag}", _pct(xs, q), "ms", "bare ASGI SSE", _pct(bx, q)))
    rows.append(Row("http_errors", float(d.errors), "requests", "bare ASGI SSE", float(b.errors)))
    title = (f"deepserve bench http: {requests} requests x {tokens} tokens, concurrency {concurrency}; "
             f"emulated TTFT p50 {ttft * 1e3:.1f} ms, TPOT p50 {tpot * 1e3:.1f} ms")  # fmt: skip
    return title, rows
