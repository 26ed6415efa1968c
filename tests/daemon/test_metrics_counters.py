"""Prometheus counters only go up: the prefix-cache counters are fed by finished requests, as
vLLM's are, so a TE replaced by the cluster manager (its own counts gone with it) no longer
makes them go backwards (a user tour: 356 queried tokens, then 268 after a kill-te)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from deepserve.actors.workload.messages import RequestDone
from deepserve.daemon.metrics import Metrics

DP = {"alive": True, "running": 0, "waiting": 0, "kv_blocks_total": 10, "kv_blocks_used": 0,
      "prompt_tokens": 0, "cached_prompt_tokens": 0}  # fmt: skip


def _counters(m: Metrics, status: dict) -> dict[str, float]:
    text = m.render(status)[0].decode()
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name.startswith("vllm:prefix_cache") and s.name.endswith("_total")}  # fmt: skip


def test_prefix_cache_counters_are_monotonic_across_a_replaced_te() -> None:
    m = Metrics("llama3-8b")
    done = dict(status="completed", reason="length", arrival_s=0.0, first_token_s=0.1, finish_s=0.5,
                output_tokens=4, te="te/0")  # fmt: skip
    m.done(RequestDone(request_id="a", prompt_tokens=300, cached_prompt_tokens=128, **done))
    m.done(RequestDone(request_id="b", prompt_tokens=56, cached_prompt_tokens=0, **done))
    before = _counters(m, {"tes": [{"dps": [dict(DP, prompt_tokens=356, cached_prompt_tokens=128)]}]})
    assert before == {"vllm:prefix_cache_queries_total": 356.0, "vllm:prefix_cache_hits_total": 128.0}
    after = _counters(m, {"tes": [{"dps": [dict(DP, prompt_tokens=0)]}]})  # te/0 replaced: counts from 0
    assert after == before


def _itl(m: Metrics) -> dict[str, float]:
    """The histogram's count, sum and cumulative buckets (by their upper bound)."""
    text = m.render({"tes": []})[0].decode()
    out = {}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name.startswith("deepserve_emulated_inter_token_latency_seconds_"):
                key = s.name.rsplit("_", 1)[1]
                out[f"le={s.labels['le']}" if key == "bucket" else key] = s.value
    return out


def test_inter_token_latency_observes_every_gap() -> None:
    """One observation per gap between consecutive tokens, as vLLM's histogram: it observed one
    mean per request, so a 0.45 s stall among 10 ms gaps showed as one ~0.1 s value."""
    from deepserve.actors.flowserve.messages import TaskTokens

    m = Metrics("llama3-8b")

    def tokens(first: int, times: tuple[float, ...]) -> TaskTokens:
        return TaskTokens(task_id="t", request_id="a", first_index=first, token_ids=(), times_s=times)

    m.tokens(tokens(0, (0.10, 0.11, 0.12)))  # a run's tokens in one message, then a stall
    m.tokens(tokens(3, (0.57,)))
    m.tokens(tokens(4, (0.58,)))
    m.done(RequestDone(request_id="a", status="completed", reason="length", arrival_s=0.0, first_token_s=0.1,
                       finish_s=0.58, prompt_tokens=8, cached_prompt_tokens=0, output_tokens=5, te="te/0"))  # fmt: skip
    got = _itl(m)
    assert got["count"] == 4.0 and abs(got["sum"] - 0.48) < 1e-9
    # three gaps of 10 ms under 20 ms; the 0.45 s stall only under 0.5 s
    assert (got["le=0.02"], got["le=0.2"], got["le=0.5"]) == (3.0, 3.0, 4.0)
    assert m._last_token_s == {}  # nothing kept for a finished request


def test_inter_token_latency_has_no_gap_across_a_retry() -> None:
    """A non-streamed request retried from scratch after its TE died: the retry's token 0 is
    not a gap after the failed attempt's last token."""
    from deepserve.actors.flowserve.messages import TaskTokens

    m = Metrics("llama3-8b")
    m.tokens(TaskTokens(task_id="a/chat.1", request_id="a", first_index=0, token_ids=(), times_s=(0.10, 0.11)))
    m.tokens(TaskTokens(task_id="a/chat.2", request_id="a", first_index=0, token_ids=(), times_s=(3.0, 3.01)))
    got = _itl(m)
    assert got["count"] == 2.0 and abs(got["sum"] - 0.02) < 1e-9
    # generated tokens count both attempts' (as vLLM's engine does), so the histogram never holds
    # more gaps than tokens minus attempts (a tour: 18,212 gaps for 18,092 tokens of 130 requests)
    m.done(RequestDone(request_id="a", status="completed", reason="length", arrival_s=0.0, first_token_s=3.0,
                       finish_s=3.01, prompt_tokens=8, cached_prompt_tokens=0, output_tokens=2, te="te/1"))  # fmt: skip
    text = m.render({"tes": []})[0].decode()
    assert 'vllm:generation_tokens_total{model_name="llama3-8b"} 4.0' in text
