"""`deepserve bench devices`, NPU rows: a typical aggregated decode run through the NPU actor,
beside the same passes sent one by one (the stepwise path), measured in the same run.

The workload: Llama-3-8B on a 910B, TP1 (the mooncake-16te scenario's TEs), a decode batch of
8 sequences with contexts of 1K-12K tokens, variance on, SimDriver without a log sink.

- npu_run_passes_per_cpu_s: passes per CPU second of this process (`time.process_time`) when
  the passes come as NpuForwardRuns of RUN_PASSES passes each, queued at t = 0 and run to the
  last answer; baseline: the same passes as single NpuForwards (each pass one request, one
  start, one timer and one answer), queued the same way.
- npu_pass_model_per_cpu_s: the performance model alone, per pass of such runs: the run's
  pass costs, variance factors and end times (`npu_run.pass_costs`, `variance_factors`,
  `run_ends`, in chunks as the actor draws them); baseline: `forward_cost_s` and one
  `ctx.rng`-style Gaussian variance draw per pass, the per-pass cost a run avoids.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from deepserve.actors.ports.npu import (
    NpuForward,
    NpuForwardDone,
    NpuForwardRun,
    NpuForwardRunDone,
    SeqShape,
)
from deepserve.adapters.hardware.devices.npu import Npu, variance_factor
from deepserve.adapters.hardware.devices.npu_draws import run_ends, variance_factors
from deepserve.adapters.hardware.devices.npu_run import (
    forward_cost_s,
    next_chunk,
    pass_costs,
    pass_shapes,
)
from deepserve.benchmarks.table import Row
from deepserve.core import SimDriver
from deepserve.core.rng import DeliveryRng

NPU = "hw/s0/npu0"
MODEL = "llama3-8b"
BATCH = tuple(SeqShape(1, 1024 + 1536 * i) for i in range(8))  # contexts 1K..11.8K
RUN_PASSES = 256  # a few seconds of decode between two batch changes
GAP_S = 0.0005


def _run(i: int) -> NpuForwardRun:
    seqs = tuple(SeqShape(1, s.context_tokens + 37 * i) for s in BATCH)
    return NpuForwardRun(req_id=f"r{i}", model=MODEL, seqs=seqs, iterations=RUN_PASSES, gap_s=GAP_S)


def actor_passes_per_cpu_s(runs: int, stepwise: bool) -> float:
    """Passes per CPU second through the NPU actor: `runs` runs, aggregated or one by one."""
    d = SimDriver(seed=1)
    d.spawn(NPU, Npu, npu="910b", queue_limit=runs * RUN_PASSES + 1)
    d.run()
    for i in range(runs):
        run = _run(i)
        if not stepwise:
            d.inject(NPU, run, src="ext/bench")
            continue
        for k in range(RUN_PASSES):
            one = NpuForward(req_id=f"r{i}.{k}", model=MODEL, seqs=pass_shapes(run, k))
            d.inject(NPU, one, src="ext/bench")
    c0 = time.process_time()
    d.run()
    cpu = time.process_time() - c0
    kind = NpuForwardDone if stepwise else NpuForwardRunDone
    answered = sum(isinstance(env.msg, kind) for _, env in d.external_out)
    if answered != (runs * RUN_PASSES if stepwise else runs):
        raise RuntimeError(f"bench: {answered} NPU requests answered")
    return runs * RUN_PASSES / cpu


def model_passes_per_cpu_s(runs: int, stepwise: bool) -> float:
    """Passes per CPU second of the performance model alone (no actor, no kernel)."""
    rng = DeliveryRng(1)
    c0 = time.process_time()
    for i in range(runs):
        run = _run(i)
        if stepwise:
            t = 0.0
            for k in range(RUN_PASSES):
                cost = forward_cost_s("910b", NpuForwardRun(
                    req_id="x", model=MODEL, seqs=pass_shapes(run, k), iterations=1))[0]  # fmt: skip
                t += cost * variance_factor(rng.gauss(0.0, 1.0)) + GAP_S
            continue
        done, t = 0, 0.0
        while done < RUN_PASSES:
            hi = done + next_chunk(done, RUN_PASSES)
            ends = run_ends(GAP_S, t, pass_costs("910b", run, done, hi), variance_factors(rng, hi - done))
            done, t = hi, ends[-1] + GAP_S
    cpu = time.process_time() - c0
    if not math.isfinite(t):
        raise RuntimeError("bench: a pass time is not finite")
    return runs * RUN_PASSES / cpu


def npu_rows(progress: Callable[[str], None] | None = None, runs: int = 40) -> list[Row]:
    """The NPU rows of `deepserve bench devices`, each beside its stepwise baseline."""
    if progress is not None:
        progress(f"{runs} aggregated decode runs of {RUN_PASSES} passes vs the same passes one by one")
    variance_factors(DeliveryRng(0), 1)  # builds the quantile table once, outside the timed runs
    agg, step = actor_passes_per_cpu_s(runs, False), actor_passes_per_cpu_s(runs, True)
    fast, slow = model_passes_per_cpu_s(runs, False), model_passes_per_cpu_s(runs, True)
    return [
        Row("npu_run_passes_per_cpu_s", agg, "passes/CPU s",
            "npu_stepwise_passes_per_cpu_s (one NpuForward a pass)", step),
        Row("npu_pass_model_per_cpu_s", fast, "passes/CPU s",
            "forward_cost_s + a gauss draw per pass", slow),
    ]  # fmt: skip
