"""vLLM's latency metrics mean what vLLM's do (issue 30 §4): `vllm:time_to_first_token_seconds`
and `vllm:e2e_request_latency_seconds` are the wall clock at the frontend, so what the official
`openai` client measured lies in the bucket the daemon put it in; the emulated values keep their
own `deepserve_emulated_*` names. When the event loop is held up (here: the daemon is stopped
with SIGSTOP while a prefill's forward pass runs), the client and the wall-clock TTFT show the
delay and `deepserve_npu_timer_lateness_seconds` says the pass's end fired late by it: the part
of the latency that is platform, not model — before, the TTFT histogram held the emulated value,
and the lateness was measured nowhere."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon
from prometheus_client.parser import text_string_to_metric_families

MODEL = "llama3-8b"
SETTINGS = ("cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0")
TOL_S = 0.5  # the client's clock starts before the frontend's and stops after it (a loaded machine)
STALL_S = 0.8


def scrape(url: str) -> dict[str, dict[str, float]]:
    """Each histogram's samples: {name: {"count": .., "sum": .., "le=0.1": ..}}."""
    text = httpx.get(url + "/metrics", timeout=10).text
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            suffix = s.name.rsplit("_", 1)[1]
            key = f"le={s.labels['le']}" if suffix == "bucket" else suffix
            out.setdefault(fam.name, {})[key] = s.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def bucket_of(d: dict[str, float]) -> tuple[float, float]:
    """The (lower, upper] bucket of the one observation in a histogram's delta."""
    bounds = sorted((float(k[3:]), v) for k, v in d.items() if k.startswith("le="))
    lo = 0.0
    for le, n in bounds:
        if n >= 1:
            return lo, le
        lo = le
    raise AssertionError(f"no observation in {d}")


def streamed(c: openai.OpenAI, words: int) -> tuple[float, float]:
    """(TTFT, end-to-end) as the client measured them: to the first text, to the stream's end."""
    t0 = time.perf_counter()
    first = None
    stream = c.completions.create(model=MODEL, prompt="word " * words, max_tokens=4, stream=True,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - t0
    assert first is not None
    return first, time.perf_counter() - t0


def stall_during_prefill(url: str, admin: str, pid: int) -> tuple[float, float]:
    """A one-pass prefill (~8,000 tokens: ~0.4 s emulated, under the batch's 8,192); once the
    request is in flight, the daemon stops for longer than that, so the pass's end fires late."""
    import threading

    got: list[tuple[float, float]] = []
    c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    t = threading.Thread(target=lambda: got.append(streamed(c, 6400)))
    t.start()
    end = time.monotonic() + 20
    while httpx.get(admin + "/admin/status", timeout=10).json()["inflight"] < 1:
        assert time.monotonic() < end
        time.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(STALL_S)
    os.kill(pid, signal.SIGCONT)
    t.join(60)
    return got[0]


def test_latency_metrics_are_the_frontends_wall_clock_and_the_emulated_ones_are_named_so(tmp_path: Path) -> None:
    proc, info = start_daemon(tmp_path / "run", *[a for s in SETTINGS for a in ("--set", s)])
    url = info["url"]
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        for words in (50, 2000):  # quiet: each request's wall TTFT and E2E, bucket by bucket
            before = scrape(url)
            ttft_c, e2e_c = streamed(c, words)
            after = scrape(url)
            for name, client_s in (("vllm:time_to_first_token_seconds", ttft_c),
                                   ("vllm:e2e_request_latency_seconds", e2e_c)):  # fmt: skip
                d = delta(after[name], before.get(name, {}))
                lo, hi = bucket_of(d)
                assert d["count"] == 1 and 0 <= client_s - d["sum"] < TOL_S, (name, client_s, d["sum"])
                assert lo - TOL_S < client_s and client_s - TOL_S <= hi, (name, client_s, lo, hi)
            emu = delta(after["deepserve_emulated_time_to_first_token_seconds"],
                        before.get("deepserve_emulated_time_to_first_token_seconds", {}))  # fmt: skip
            assert emu["count"] == 1 and 0 < emu["sum"] <= ttft_c

        before = scrape(url)
        ttft_c, _ = stall_during_prefill(url, info["admin_url"], proc.pid)
        after = scrape(url)
    finally:
        stop_daemon(proc)
    wall = delta(after["vllm:time_to_first_token_seconds"], before["vllm:time_to_first_token_seconds"])
    emu = delta(after["deepserve_emulated_time_to_first_token_seconds"],
                before["deepserve_emulated_time_to_first_token_seconds"])  # fmt: skip
    late = delta(after["deepserve_npu_timer_lateness_seconds"], before["deepserve_npu_timer_lateness_seconds"])
    assert 0 <= ttft_c - wall["sum"] < TOL_S, (ttft_c, wall)  # the client saw the stall, and so does the metric
    # the TE's token times are taken when its pass's end fired, so the emulated TTFT holds the stall
    # too: the lateness histogram is what tells that part (platform, not model) apart
    assert emu["count"] == 1 and emu["sum"] > STALL_S / 2, emu
    assert late["count"] >= 1 and late["count"] - late["le=0.1"] >= 1, late  # a pass's end fired > 0.1 s late
    assert late["sum"] > STALL_S / 4, late
