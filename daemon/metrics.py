"""Prometheus metrics (prometheus_client), vLLM's names where one exists.

Latencies are the emulated ones, from each request's recorded terminal state (arrival, first
token, finish on the daemon's clock); gauges are read from the masters' state at scrape time."""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.workload.messages import RequestDone

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    def __init__(self, model: str) -> None:
        r = self.registry = CollectorRegistry()
        lbl = ["model_name"]
        self.model = model
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", lbl, registry=r, buckets=BUCKETS)
        # One observation per gap between consecutive output tokens, as vLLM's: a mean per
        # request hid a stall between two tokens behind the request's other gaps.
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Inter-token latency", lbl,
                             registry=r, buckets=ITL_BUCKETS)  # fmt: skip
        self._last_token_s: dict[str, float] = {}  # request -> its last token's time (in flight)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", lbl, registry=r,
                             buckets=BUCKETS)  # fmt: skip
        self.success = Counter("vllm:request_success", "Finished requests", [*lbl, "finished_reason"], registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens", lbl, registry=r)
        # Counted as tokens arrive, as vLLM's engine counts them: an attempt a retry discarded made
        # its tokens too, and its gaps are in the ITL histogram (counted at the end from the
        # final attempt alone, the histogram held more gaps than there were tokens, a tour).
        self.gen_tokens = Counter("vllm:generation_tokens", "Generated tokens", lbl, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Running requests", lbl, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting requests", lbl, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1)", lbl, registry=r)
        # Counters, as vLLM's, fed by each finished request's prompt and cached tokens: sums of
        # the live TEs' own counts went backwards when a replaced TE took its history along.
        self.pc_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens queried against the prefix cache",
                                  lbl, registry=r)  # fmt: skip
        self.pc_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", lbl, registry=r)
        self.terminal = Counter("deepserve_requests", "Requests by terminal status (rejected_429: shed by "
                                "daemon.max_inflight, never admitted)", ["status"], registry=r)  # fmt: skip
        for status in ("completed", "failed", "cancelled", "rejected_429"):
            self.terminal.labels(status)  # every series from the start, at 0 until it happens
        self.faults = Counter("deepserve_faults", "Faults injected through the admin API", ["kind"], registry=r)
        self.client_ttft_s = Histogram("deepserve_frontend_first_token_seconds",
                                       "Frontend-observed wait for the first token", registry=r, buckets=BUCKETS)  # fmt: skip

    def client_ttft(self, seconds: float) -> None:
        self.client_ttft_s.observe(seconds)

    def tokens(self, msg: TaskTokens) -> None:
        """Each gap between consecutive output tokens of a request (emulated token times)."""
        itl = self.itl.labels(self.model)
        self.gen_tokens.labels(self.model).inc(len(msg.times_s))
        # token 0 again: a retry from scratch (a non-streamed request), no gap to the failed attempt
        prev = self._last_token_s.get(msg.request_id) if msg.first_index else None
        for t in msg.times_s:
            if prev is not None:
                itl.observe(max(0.0, t - prev))
            prev = t
        if prev is not None:
            self._last_token_s[msg.request_id] = prev

    def rejected(self) -> None:
        """A request shed with 429 (over `daemon.max_inflight`): it never reached the cluster."""
        self.terminal.labels("rejected_429").inc()

    def done(self, d: RequestDone) -> None:
        self._last_token_s.pop(d.request_id, None)
        m = self.model
        self.terminal.labels(d.status).inc()
        self.success.labels(m, d.reason if d.status == "completed" else d.status).inc()
        self.prompt_tokens.labels(m).inc(d.prompt_tokens)
        self.pc_queries.labels(m).inc(d.prompt_tokens)
        self.pc_hits.labels(m).inc(d.cached_prompt_tokens)
        self.e2e.labels(m).observe(max(0.0, d.finish_s - d.arrival_s))
        if d.first_token_s is not None:
            self.ttft.labels(m).observe(max(0.0, d.first_token_s - d.arrival_s))

    def render(self, status: dict[str, Any]) -> tuple[bytes, str]:
        m = self.model
        dps = [dp for te in status["tes"] for dp in te["dps"] if dp.get("alive")]
        self.running.labels(m).set(sum(dp["running"] for dp in dps))
        self.waiting.labels(m).set(sum(dp["waiting"] for dp in dps))
        total = sum(dp["kv_blocks_total"] for dp in dps) or 1
        self.kv.labels(m).set(sum(dp["kv_blocks_used"] for dp in dps) / total)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
