"""vLLM's metric names where the meaning exists (issue 30 §4), fed by the frontend's hooks: a
cancelled request's `finished_reason` is `abort` (it was `cancelled`, a label vLLM never uses);
per-request token counts, the `n` and `max_tokens` parameters, the decode phase's time, the KV
cache's configuration; and the NPU timer lateness the driver measures — a driver-side number
that leaves the log exactly as it was."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.hardware.devices.npu import GRAPH_KEY
from deepserve.core import Actor, Context, Event, MemorySink, Message
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.daemon.config import DaemonConfig
from deepserve.daemon.metrics import Metrics, cache_info, token_buckets

M = "llama3-8b"


def samples(m: Metrics, status: dict | None = None) -> dict[str, float]:
    text = m.render(status or {"tes": []})[0].decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def done(rid: str, status: str, reason: str, out: int = 3, preemptions: int = 0) -> RequestDone:
    return RequestDone(request_id=rid, status=status, reason=reason, arrival_s=1.0, first_token_s=1.2,  # type: ignore[arg-type]
                       finish_s=1.5, prompt_tokens=40, cached_prompt_tokens=16, output_tokens=out, te="te/0",
                       preemptions=preemptions)  # fmt: skip


def test_finished_reasons_are_vllms_and_a_cancel_is_abort() -> None:
    m = Metrics(M)
    for rid, status, reason in (("a", "completed", "length"), ("b", "completed", "target"), ("c", "completed", "stop"),
                                ("d", "completed", "stop sequence"), ("e", "cancelled", "the client disconnected"),
                                ("f", "failed", "te/1 died")):  # fmt: skip
        m.done(done(rid, status, reason))
    s = samples(m)
    got = {r: s[f"vllm:request_success_total{{finished_reason={r}}}"] for r in ("stop", "length", "abort", "error")}
    assert got == {"stop": 2.0, "length": 2.0, "abort": 1.0, "error": 1.0}
    assert not [k for k in s if "finished_reason=cancelled" in k or "finished_reason=failed" in k]


def test_per_request_histograms_and_the_decode_phase() -> None:
    m = Metrics(M, max_model_len=1000)
    m.arrived("a", 0.0, n=2, max_tokens=64)
    m.tokens(TaskTokens(task_id="a/chat.1", request_id="a", first_index=0, token_ids=(), times_s=(1.2,)))
    m.tokens(TaskTokens(task_id="a/chat.1", request_id="a", first_index=1, token_ids=(), times_s=(1.25, 1.3)))
    m.done(done("a", "completed", "length", preemptions=2))
    s = samples(m)
    assert s["vllm:num_preemptions_total"] == 2.0
    assert (s["vllm:request_prompt_tokens_count"], s["vllm:request_prompt_tokens_sum"]) == (1.0, 40.0)
    assert (s["vllm:request_generation_tokens_count"], s["vllm:request_generation_tokens_sum"]) == (1.0, 3.0)
    assert (s["vllm:request_params_n_sum"], s["vllm:request_params_max_tokens_sum"]) == (2.0, 64.0)
    assert s["vllm:request_params_n_bucket{le=1.0}"] == 0.0 and s["vllm:request_params_n_bucket{le=2.0}"] == 1.0
    assert abs(s["vllm:request_decode_time_seconds_sum"] - 0.1) < 1e-9  # first token 1.2 to last 1.3 (emulated)
    assert s["vllm:time_to_first_token_seconds_count"] == 1.0 and s["vllm:e2e_request_latency_seconds_count"] == 1.0
    assert s["vllm:inter_token_latency_seconds_count"] == 1.0  # one gap: between the two token messages
    assert s["deepserve_emulated_inter_token_latency_seconds_count"] == 2.0  # two gaps between the three tokens
    assert m._wall == {} and m._last_token_s == {}  # nothing kept for a finished request
    assert token_buckets(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def test_a_refused_or_unsubmitted_request_leaves_nothing_behind() -> None:
    m = Metrics(M)
    m.arrived("r", 0.0)
    m.rejected("r")
    m.arrived("s", 0.0)
    m.forget("s")
    assert m._wall == {} and samples(m)["deepserve_requests_total{status=rejected_429}"] == 1.0


def test_cache_config_info_is_the_daemons_kv_cache() -> None:
    cfg = DaemonConfig()
    info = cache_info(cfg)
    assert info["block_size"] == str(cfg.cluster.kv_block_tokens) and int(info["num_gpu_blocks"]) > 0
    s = samples(Metrics(M, info))
    (key,) = [k for k in s if k.startswith("vllm:cache_config_info")]
    assert s[key] == 1.0 and f"block_size={cfg.cluster.kv_block_tokens}" in key


class TimerProbe(Message, frozen=True):
    n: int


class TimerProbed(Event, frozen=True):
    n: int


class TimerProber(Actor[int]):
    def initial_state(self) -> int:
        return 0

    def evolve(self, s: int, e: Event) -> int:
        return s + 1

    def handle(self, ctx: Context, msg: Message) -> None:
        if not isinstance(msg, TimerProbe):
            return
        ctx.record(TimerProbed(msg.n))
        if msg.n < 3:
            ctx.after(0.01, TimerProbe(msg.n + 1), key=GRAPH_KEY)
        ctx.after(5.0, TimerProbe(99), key="cancelled")
        ctx.cancel("cancelled")


def test_the_driver_measures_each_fired_timers_lateness_and_the_metrics_keep_the_npus() -> None:
    late: list[tuple[str, float]] = []

    async def main(hook: bool) -> MemorySink:
        sink = MemorySink()
        async with AsyncDriver(seed=1, sink=sink) as d:
            if hook:
                d.timer_late = lambda key, s: late.append((key, s))
            d.spawn("npu", TimerProber)
            await d.inject("npu", TimerProbe(0))
            while sum(step.input.type == "TimerProbe" for step in sink.steps) < 4:
                await asyncio.sleep(0.005)
        return sink

    with_hook = asyncio.run(main(True))
    assert [k for k, _ in late] == [GRAPH_KEY] * 3  # one per timer fired; the cancelled one never fires
    assert all(0.0 <= s < 5.0 for _, s in late)
    without = asyncio.run(main(False))
    events = [[(e.type, e.payload) for e in step.events] for step in with_hook.steps]
    assert events == [[(e.type, e.payload) for e in step.events] for step in without.steps]  # nothing recorded

    m = Metrics(M)
    m.timer_late(GRAPH_KEY, 0.003)
    m.timer_late("report", 0.2)  # a TE shell's report tick: not an NPU's forward pass
    m.timer_late(GRAPH_KEY, -1e-9)  # a float a hair early counts as on time
    s = samples(m)
    assert s["deepserve_npu_timer_lateness_seconds_count"] == 2.0
    assert abs(s["deepserve_npu_timer_lateness_seconds_sum"] - 0.003) < 1e-12


def test_te_processes_lateness_adds_up_and_never_goes_backwards() -> None:
    """Processes mode: each TE process's counts come in its status rows; a process gone (its
    TE replaced) keeps what it counted, as a Prometheus histogram must."""
    m = Metrics(M)
    m.timer_late(GRAPH_KEY, 0.0002)  # the main process's own NPUs (none in processes mode)

    def row(pod: str, counts: list[int], sum_s: float) -> dict:
        return {"pod": pod, "dps": [], "npu_timer_lateness": {"counts": counts, "sum_s": sum_s}}

    n = len(m.lateness.counts)
    one = [0] * n
    one[3] = 5  # five ends fired 0.5-1 ms late
    two = [0] * n
    two[-1] = 1  # one over the largest bucket

    def count(*rows: dict) -> tuple[float, float, float]:
        s = samples(m, {"tes": list(rows)})
        return (s["deepserve_npu_timer_lateness_seconds_count"], round(s["deepserve_npu_timer_lateness_seconds_sum"], 9),
                s["deepserve_npu_timer_lateness_seconds_bucket{le=0.001}"])

    want = (7.0, 3.0042, 6.0)
    assert count(row("te/0#g1", one, 0.004), row("te/1#g1", two, 3.0)) == want
    assert count(row("te/0#g1", one, 0.004), {"pod": "te/1#g1", "dps": []}) == want  # its file unread once
    assert count(row("te/0#g1", one, 0.004), row("te/1#g2", [0] * n, 0.0)) == want  # te/1 replaced: kept
    assert count(row("te/0#g1", one, 0.004)) == want
