"""Prometheus metrics (prometheus_client), vLLM's names where the meaning exists.

Two clocks, never mixed under one name (README, "Metrics"):
- wall: what the frontend saw, on `time.perf_counter` — the request's arrival at the frontend
  (`arrived`), each token message as it reached it (`tokens`), its terminal state (`done`). vLLM's
  latency names (`vllm:time_to_first_token_seconds`, `vllm:e2e_request_latency_seconds`,
  `vllm:inter_token_latency_seconds`, `vllm:time_per_output_token_seconds`) are these, as vLLM's
  are measured by its server.
- emulated: what the performance model says, from the TE's token times and the request's recorded
  terminal state (arrival, first token, finish on the daemon's clock): `deepserve_emulated_*`,
  and vLLM's engine-phase names whose meaning is the emulated engine's: queue (the DP master's
  QUEUED to its first SCHEDULED, both in the terminal state), prefill (SCHEDULED to the first
  token), decode (first to last token), inference (SCHEDULED to the last token), and the tokens of
  each forward pass (`vllm:iteration_tokens_total`, from the pass's `TokenBatch`).
The gap between the two is platform overhead; `deepserve_npu_timer_lateness_seconds` is the part
of it that is the event loop firing an emulated forward pass's end late.
Gauges are read from the masters' state at scrape time."""

from __future__ import annotations

import functools
import time
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from deepserve.actors.flowserve.messages import TaskTokens, TokenBatch
from deepserve.actors.workload.messages import RequestDone

from .lateness import Lateness, LatenessCollector
from .tally import Tallies

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read these as theirs
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
EMULATED_ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.5, 1.0)  # finer: model-made gaps
N_BUCKETS = (1, 2, 5, 10, 20)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISHED_REASONS = ("stop", "length", "abort", "error")  # vLLM's FinishReason strings


def token_buckets(limit: int) -> tuple[int, ...]:
    """vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `limit`."""
    out: list[int] = []
    mantissa, exp = (1, 2, 5), 0
    while True:
        for m in mantissa:
            v = m * 10**exp
            if v > limit:
                return tuple(out)
            out.append(v)
        exp += 1


class _Wall:
    """One open request as the frontend saw it (perf_counter seconds)."""

    __slots__ = ("arrival", "first", "last", "n", "max_tokens", "prompt_tokens")

    def __init__(self, arrival: float, n: int, max_tokens: int, prompt_tokens: int = 0) -> None:
        self.arrival, self.n, self.max_tokens, self.prompt_tokens = arrival, n, max_tokens, prompt_tokens
        self.first: float | None = None
        self.last: float | None = None


def finished_reason(d: RequestDone) -> str:
    """vLLM's `finished_reason` of a terminal state: a cancel (a client gone, a TTFT deadline) is
    `abort`, as vLLM's; a failure `error`; a stop sequence or EOS `stop`."""
    if d.status == "cancelled":
        return "abort"
    if d.status == "failed":
        return "error"
    return "length" if d.reason in ("length", "target") else "stop"


class Metrics:
    def __init__(self, model: str, cache_info: dict[str, str] | None = None, max_model_len: int = 40_960) -> None:
        r = self.registry = CollectorRegistry()
        self.model = model
        # The hooks' series observe through tallies, folded at each scrape (tally.py: ~6 % of the
        # event loop's CPU under load was prometheus_client's per-call locks)
        self._t = Tallies()
        self._wall_clock()
        self._emulated()
        self._counts(max_model_len)
        if cache_info:
            info = Gauge("vllm:cache_config_info", "Information of the KV cache configuration", list(cache_info),
                         registry=r)  # fmt: skip
            info.labels(**cache_info).set(1)
        self.terminal = Counter("deepserve_requests", "Requests by terminal status (rejected_429: refused by the "
                                "gateway over daemon.max_inflight, never admitted)", ["status"], registry=r)  # fmt: skip
        for status in ("completed", "failed", "cancelled", "rejected_429"):
            self.terminal.labels(status)  # every series from the start, at 0 until it happens
        self.faults = Counter("deepserve_faults", "Faults injected through the admin API", ["kind"], registry=r)
        self.lateness = Lateness()
        self._late_collector = LatenessCollector(self.lateness)
        r.register(self._late_collector)  # type: ignore[arg-type]

    def _hist(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, ["model_name"], registry=self.registry, buckets=buckets)

    def _wall_clock(self) -> None:
        hist = self._hist
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token (wall clock at the frontend: "
                         "arrival to the first token received for the client)", TTFT_BUCKETS)  # fmt: skip
        self.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency (wall clock at the "
                        "frontend: arrival to the terminal state)", REQUEST_BUCKETS)  # fmt: skip
        self.itl = hist("vllm:inter_token_latency_seconds", "Inter-token latency (wall clock at the frontend: "
                        "between consecutive token messages of a request)", ITL_BUCKETS)  # fmt: skip
        self.tpot = hist("vllm:time_per_output_token_seconds", "Time per output token (wall clock at the "
                         "frontend: first to last token, over the tokens after the first)", ITL_BUCKETS)  # fmt: skip
        self._wall: dict[str, _Wall] = {}  # request -> its frontend times (open requests only)

    def _emulated(self) -> None:
        """The performance model's times (the TE's token times, the recorded terminal state)."""
        hist = self._hist
        self.emu_ttft = hist("deepserve_emulated_time_to_first_token_seconds",
                             "Emulated time to first token (the TE's first token time - arrival)", TTFT_BUCKETS)  # fmt: skip
        self.emu_e2e = hist("deepserve_emulated_e2e_request_latency_seconds",
                            "Emulated end-to-end latency (finish - arrival, daemon clock)", REQUEST_BUCKETS)  # fmt: skip
        # One observation per gap between consecutive output tokens: a mean per request hid a
        # stall between two tokens behind the request's other gaps.
        self.emu_itl = hist("deepserve_emulated_inter_token_latency_seconds",
                            "Emulated inter-token latency (gaps between the TE's token times)", EMULATED_ITL_BUCKETS)  # fmt: skip
        self.decode_time = hist("vllm:request_decode_time_seconds", "Time in the DECODE phase (emulated: the "
                                "TE's first to last token time)", REQUEST_BUCKETS)  # fmt: skip
        # vLLM's engine phases from the DP master's QUEUED and first SCHEDULED times (RequestDone;
        # PD: the prefill task's), its first token time and the last token's
        self.queue_time = hist("vllm:request_queue_time_seconds", "Time in the WAITING phase (emulated: queued "
                               "on the DP master to its first scheduling)", REQUEST_BUCKETS)  # fmt: skip
        self.prefill_time = hist("vllm:request_prefill_time_seconds", "Time in the PREFILL phase (emulated: "
                                 "first scheduling to the first token)", REQUEST_BUCKETS)  # fmt: skip
        self.inference_time = hist("vllm:request_inference_time_seconds", "Time in the RUNNING phase "
                                   "(emulated: first scheduling to the last token)", REQUEST_BUCKETS)  # fmt: skip
        self.iteration = hist("vllm:iteration_tokens_total", "Tokens per engine step (a DP master's forward "
                              "pass: the tokens it emitted, plus the prompt of each request it gave its first "
                              "token)", ITERATION_BUCKETS)  # fmt: skip
        self._last_token_s: dict[str, float] = {}  # request -> its last token's emulated time (in flight)

    def _counts(self, max_model_len: int) -> None:
        hist, r, lbl, model = self._hist, self.registry, ["model_name"], self.model
        tb = token_buckets(max_model_len)
        self.req_prompt = hist("vllm:request_prompt_tokens", "Prompt tokens per finished request", tb)
        self.req_gen = hist("vllm:request_generation_tokens", "Generated tokens per finished request", tb)
        self.params_n = hist("vllm:request_params_n", "The n request parameter", N_BUCKETS)
        self.params_max = hist("vllm:request_params_max_tokens", "The max_tokens request parameter", tb)
        self.success = Counter("vllm:request_success", "Finished requests", [*lbl, "finished_reason"], registry=r)
        for reason in FINISHED_REASONS:
            self.success.labels(model, reason)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens", lbl, registry=r)
        # Counted as tokens arrive, as vLLM's engine counts them: an attempt a retry discarded made
        # its tokens too, and its gaps are in the ITL histograms.
        self.gen_tokens = Counter("vllm:generation_tokens", "Generated tokens", lbl, registry=r)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions (KV blocks ran out), counted when a "
                                   "request finishes: those of the task that finished it", lbl, registry=r)  # fmt: skip
        self.running = Gauge("vllm:num_requests_running", "Running requests", lbl, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting requests", lbl, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (0-1)", lbl, registry=r)
        # Counters, as vLLM's, fed by each finished request's prompt and cached tokens: sums of
        # the live TEs' own counts went backwards when a replaced TE took its history along.
        self.pc_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens queried against the prefix cache",
                                  lbl, registry=r)  # fmt: skip
        self.pc_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache", lbl, registry=r)

    # ---- the frontend's hooks ------------------------------------------------------------------
    def arrived(self, request_id: str, at: float, n: int = 1, max_tokens: int = 0, prompt_tokens: int = 0) -> None:
        """A request reached the frontend at `at` (perf_counter), before it is submitted."""
        self._wall[request_id] = _Wall(at, n, max_tokens, prompt_tokens)

    def forget(self, request_id: str) -> None:
        """A request that was never submitted (the daemon is stopping)."""
        self._wall.pop(request_id, None)

    @functools.cached_property
    def _per_token(self) -> tuple[Any, Any, Any, Any, Any]:
        """The series `tokens` and `pass_output` move, bound to the model once: `labels()` a chunk
        was 1-2 % of the daemon's CPU under load (a lock and a dict lookup each, four times a chunk)."""
        m, t = self.model, self._t
        return (t.counter(self.gen_tokens, m), t.hist(self.ttft, m), t.hist(self.itl, m), t.hist(self.emu_itl, m),
                t.hist(self.iteration, m))  # fmt: skip

    def tokens(self, msg: TaskTokens) -> None:
        """A token message reached the frontend: the wall clock's first token or gap, and each gap
        between consecutive emulated token times."""
        now = time.perf_counter()
        gen_tokens, ttft, wall_itl, itl, _ = self._per_token
        rid = msg.request_id
        gen_tokens.inc(len(msg.times_s))
        w = self._wall.get(rid)
        if w is not None:
            if w.first is None:
                w.first = now
                ttft.observe(now - w.arrival)
            elif w.last is not None and msg.first_index:
                wall_itl.observe(now - w.last)
            w.last = now
        # token 0 again: a retry from scratch (a non-streamed request), no gap to the failed attempt
        prev = self._last_token_s.get(rid) if msg.first_index else None
        for t in msg.times_s:
            if prev is not None:
                itl.observe(max(0.0, t - prev))
            prev = t
        if prev is not None:
            self._last_token_s[rid] = prev

    def pass_output(self, msg: TokenBatch) -> None:
        """`batch(msg)`, then `tokens(c)` for each of its chunks (the readable version, which
        tests/daemon/test_metrics_pass.py checks this against), in one loop over the chunks and
        their token times, with the series bound once and one clock read: the chunks reached the
        frontend together. The runtime's hook."""
        now = time.perf_counter()
        gen_tokens, ttft, wall_itl, itl, iteration = self._per_token
        wall, last_token_s = self._wall, self._last_token_s
        per: dict[float, int] = {}  # `batch`'s: tokens a pass, by its end time
        emitted = 0
        for c in msg.chunks:
            rid, times, first_index = c.request_id, c.times_s, c.first_index
            emitted += len(times)
            w = wall.get(rid)
            prev = last_token_s.get(rid) if first_index else None
            for t in times:
                per[t] = per.get(t, 0) + 1
                if prev is not None:
                    itl.observe(max(0.0, t - prev))
                prev = t
            if prev is not None:
                last_token_s[rid] = prev
            if first_index == 0 and times:  # its prefill ended in this pass: `batch`'s prompt
                first = w or wall.get(rid.rpartition("-n")[0])
                if first is not None:
                    per[times[0]] += first.prompt_tokens
            if w is not None:
                if w.first is None:
                    w.first = now
                    ttft.observe(now - w.arrival)
                elif w.last is not None and first_index:
                    wall_itl.observe(now - w.last)
                w.last = now
        gen_tokens.inc(emitted)
        for n in per.values():
            iteration.observe(n)

    def batch(self, msg: TokenBatch) -> None:
        """A forward pass's output reached the frontend (a DP master's `TokenBatch`): vLLM's
        `iteration_tokens_total`, the tokens the pass emitted plus the prompt of each request whose
        first token it was (vLLM counts a prompt in the step that ends its prefill). A pass that
        emitted nothing (a prefill chunk that does not end its prompt) sends none and is not
        counted. An aggregated run's batch holds several passes: told apart by their end times."""
        per: dict[float, int] = {}
        wall = self._wall
        for c in msg.chunks:
            times = c.times_s
            for t in times:
                per[t] = per.get(t, 0) + 1
            if c.first_index == 0 and times:  # its prefill ended in this pass
                rid = c.request_id
                # choices 1..n-1 (`{rid}-n{i}`) share the first choice's prompt
                w = wall.get(rid) or wall.get(rid.rpartition("-n")[0])
                if w is not None:
                    per[times[0]] += w.prompt_tokens
        h = self._t.hist(self.iteration, self.model)
        for n in per.values():
            h.observe(n)

    def rejected(self, request_id: str = "") -> None:
        """A request the gateway refused with 429 (over `daemon.max_inflight`): never admitted."""
        self._wall.pop(request_id, None)
        self._t.counter(self.terminal, "rejected_429").inc()

    def done(self, d: RequestDone) -> None:
        now = time.perf_counter()
        rid, m, t = d.request_id, self.model, self._t
        hist, count = t.hist, t.counter
        last_s = self._last_token_s.pop(rid, None)
        count(self.terminal, d.status).inc()
        count(self.success, m, finished_reason(d)).inc()
        count(self.prompt_tokens, m).inc(d.prompt_tokens)
        count(self.preemptions, m).inc(d.preemptions)
        count(self.pc_queries, m).inc(d.prompt_tokens)
        count(self.pc_hits, m).inc(d.cached_prompt_tokens)
        hist(self.req_prompt, m).observe(d.prompt_tokens)
        hist(self.req_gen, m).observe(d.output_tokens)
        hist(self.emu_e2e, m).observe(max(0.0, d.finish_s - d.arrival_s))
        if d.first_token_s is not None:
            hist(self.emu_ttft, m).observe(max(0.0, d.first_token_s - d.arrival_s))
            if last_s is not None:  # first_token_s: the attempt the client got (a retry's own)
                hist(self.decode_time, m).observe(max(0.0, last_s - d.first_token_s))
        self._phases(d, last_s)
        w = self._wall.pop(rid, None)
        if w is None:
            return
        hist(self.e2e, m).observe(now - w.arrival)
        hist(self.params_n, m).observe(w.n)
        hist(self.params_max, m).observe(w.max_tokens)
        if w.first is not None and w.last is not None and d.output_tokens > 1:
            hist(self.tpot, m).observe((w.last - w.first) / (d.output_tokens - 1))

    def _phases(self, d: RequestDone, last_s: float | None) -> None:
        """vLLM's queue, prefill and inference times, each once the request has both its ends: one
        cancelled while queued has none, one cancelled before its first token a queue time only."""
        m, sched, hist = self.model, d.scheduled_s, self._t.hist
        if sched is None:
            return
        if d.queued_s is not None:
            hist(self.queue_time, m).observe(max(0.0, sched - d.queued_s))
        if d.first_token_s is not None:
            hist(self.prefill_time, m).observe(max(0.0, d.first_token_s - sched))
        if last_s is not None:
            hist(self.inference_time, m).observe(max(0.0, last_s - sched))

    def timer_late(self, key: str, late_s: float) -> None:
        """The driver fired a timer `late_s` after its deadline: an NPU's forward-pass end counts."""
        self.lateness.observe(key, late_s)

    def render(self, status: dict[str, Any]) -> tuple[bytes, str]:
        m = self.model
        self._t.fold()
        dps = [dp for te in status["tes"] for dp in te["dps"] if dp.get("alive")]
        self.running.labels(m).set(sum(dp["running"] for dp in dps))
        self.waiting.labels(m).set(sum(dp["waiting"] for dp in dps))
        total = sum(dp["kv_blocks_total"] for dp in dps) or 1
        self.kv.labels(m).set(sum(dp["kv_blocks_used"] for dp in dps) / total)
        # processes mode: each TE process's NPU lateness, from its status file (status()'s rows)
        rows = [te for te in status["tes"] if te.get("pod")]
        self._late_collector.update({te["pod"] for te in rows}, {te["pod"]: te["npu_timer_lateness"]
                                                                 for te in rows if te.get("npu_timer_lateness")})  # fmt: skip
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def cache_info(cfg: Any) -> dict[str, str]:
    """`vllm:cache_config_info`'s labels: the KV cache as the daemon's config sizes it (per DP
    group of a colocated TE: HBM blocks after the weights, DRAM-tier blocks)."""
    from deepserve.cluster.te import kv_sizing

    c = cfg.cluster
    size = kv_sizing(c)
    return {"block_size": str(c.kv_block_tokens), "num_gpu_blocks": str(size.hbm_blocks),
            "num_cpu_blocks": str(size.dram_blocks), "enable_prefix_caching": str(bool(c.prefix_caching)),
            "cpu_offload_gb": f"{c.kv_dram_gb:g}"}  # fmt: skip
