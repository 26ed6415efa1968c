"""vLLM's engine-phase metrics with vLLM's meaning (issue 30 §4), on the emulated clock: queue time
(queued on the DP master → its first scheduling), prefill (first scheduling → first token),
inference (first scheduling → last token), and `vllm:iteration_tokens_total` (a forward pass's
tokens: those it emitted plus the prompt of each request whose prefill it ended, as vLLM counts
a step). Before, none of the four was exported: a task's first scheduling time was not in its
terminal state, and nothing counted a pass's tokens. Unit tests of the hooks, then a live daemon
through the official `openai` client, where the phases must add up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2 as httpx
import openai
import pytest
from daemonproc import start_daemon, stop_daemon
from msgspec.structs import replace
from prometheus_client.parser import text_string_to_metric_families
from test_metrics_names import done, samples

from deepserve.actors.flowserve.messages import TaskTokens, TokenBatch
from deepserve.daemon.metrics import Metrics

M = "llama3-8b"
MODEL = "llama3-8b"


def chunk(rid: str, first: int, *times: float) -> TaskTokens:
    return TaskTokens(task_id=f"{rid}/chat.1", request_id=rid, first_index=first, token_ids=(), times_s=times)


def test_queue_prefill_and_inference_times_are_the_masters_phases() -> None:
    m = Metrics(M)
    m.arrived("a", 0.0)
    m.tokens(chunk("a", 0, 1.2))
    m.tokens(chunk("a", 1, 1.25, 1.3))
    # arrival 1.0, queued 1.0, scheduled 1.05, first token 1.2, last 1.3
    m.done(replace(done("a", "completed", "length"), queued_s=1.0, scheduled_s=1.05))
    s = samples(m)
    for name, want in (("queue", 0.05), ("prefill", 0.15), ("inference", 0.25), ("decode", 0.1)):
        assert s[f"vllm:request_{name}_time_seconds_count"] == 1.0, name
        assert s[f"vllm:request_{name}_time_seconds_sum"] == pytest.approx(want), name


def test_a_request_never_scheduled_or_never_given_a_token_observes_only_what_it_reached() -> None:
    m = Metrics(M)
    cut = done("x", "cancelled", "the client disconnected")
    m.done(replace(cut, request_id="q", first_token_s=None, queued_s=1.0))  # cancelled while queued
    m.done(replace(cut, request_id="p", first_token_s=None, queued_s=1.0, scheduled_s=1.1))  # ... in its prefill
    s = samples(m)
    assert s["vllm:request_queue_time_seconds_count"] == 1.0  # p's; q has no scheduling
    assert "vllm:request_prefill_time_seconds_count" not in s  # no observation: no series yet
    assert "vllm:request_inference_time_seconds_count" not in s


def test_iteration_tokens_count_each_pass_and_a_prompt_in_the_pass_that_ends_its_prefill() -> None:
    m = Metrics(M)
    m.arrived("a", 0.0, prompt_tokens=40)
    m.arrived("b", 0.0, n=2, prompt_tokens=7)
    # one pass: a's prefill ends (its first token), b decodes its 6th token
    m.batch(TokenBatch(chunks=(chunk("a", 0, 2.0), chunk("b", 5, 2.0))))
    # an aggregated run: three passes; choice 1 of b (`b-n1`, b's prompt) gets its first token in the first
    m.batch(TokenBatch(chunks=(chunk("a", 1, 3.0, 3.1, 3.2), chunk("b-n1", 0, 3.0, 3.1))))
    s = samples(m)
    assert s["vllm:iteration_tokens_total_count"] == 4.0
    assert s["vllm:iteration_tokens_total_sum"] == (40 + 1 + 1) + (1 + 7 + 1) + 2 + 1
    assert s["vllm:iteration_tokens_total_bucket{le=1.0}"] == 1.0  # the run's last pass: a alone
    assert s["vllm:iteration_tokens_total_bucket{le=8.0}"] == 2.0


async def _load(url: str, n: int) -> None:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    try:
        await asyncio.gather(*(c.completions.create(model=MODEL, prompt=f"request {i} " * (20 + 30 * i),
                                                    max_tokens=8, extra_body={"ignore_eos": True})
                               for i in range(n)))  # fmt: skip
    finally:
        await c.close()


def test_a_live_daemons_phases_add_up_and_its_passes_hold_every_token(tmp_path: Path) -> None:
    # two sequences a batch: of six requests sent at once, four wait in the master's queue
    settings = ("cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0", "cluster.scheduler.max_running=2")
    proc, info = start_daemon(tmp_path / "run", *[a for s in settings for a in ("--set", s)])
    try:
        asyncio.run(_load(info["url"], 6))
        text = httpx.get(info["url"] + "/metrics", timeout=10).text
    finally:
        stop_daemon(proc)
    s = {x.name: x.value for f in text_string_to_metric_families(text) for x in f.samples if not x.labels.get("le")}
    phase = {p: s[f"vllm:request_{p}_time_seconds_sum"] for p in ("queue", "prefill", "decode", "inference")}
    assert all(s[f"vllm:request_{p}_time_seconds_count"] == 6.0 for p in phase), s
    # same clock, same ends: inference = prefill + decode, request by request
    assert phase["inference"] == pytest.approx(phase["prefill"] + phase["decode"], rel=1e-6)
    assert phase["queue"] > 0.0  # four of them waited for a batch slot
    # queue + prefill ends at the first token: within the emulated TTFT (which starts at the gateway)
    assert phase["queue"] + phase["prefill"] <= s["deepserve_emulated_time_to_first_token_seconds_sum"] + 1e-6
    # every pass that emitted: its tokens, plus each prompt once (no request was retried)
    assert s["vllm:iteration_tokens_total_sum"] == s["vllm:generation_tokens_total"] + s["vllm:prompt_tokens_total"]
    assert 8 <= s["vllm:iteration_tokens_total_count"] < 48  # passes, not tokens
