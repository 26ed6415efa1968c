"""DeepServe §6's fast-scaling pipeline: its settings (`[scaling]`, off by default), the pools of
pre-warmed pods and TEs (§6.1), and each boot's plan through Table 2's five steps.

- Scaler-Pre: a pod from the pre-warmed pool (shared across models: `pod_attach_s`), else one
  created (`pods.pod_start_s`, the launcher's creation time).
- TE-Pre-Load: a pre-warmed TE (model-agnostic, parallelism-agnostic: a TP-t TE packs t
  pre-warmed SPMD executors of its server and one pre-warmed SPMD master per DP group, then
  binds its model's parameters, `te_attach_s`), else a cold start whose modeled costs are
  Python start, NPU initialisation and HCCL set-up (`python_init_s`, `npu_init_s`,
  `hccl_init_s`: the papers give no figure, so published vLLM start-up measurements, cited at
  the fields and in docs/scaling.md), optionally queued behind the cold starts already
  importing on the same server (`import_serial`).
- TE-Load: NPU-fork from a running TE (fork.py), else the host's DRAM page cache (a hit, when
  DRAM pre-loading predicted the model, preload.py) or the SSD (a miss).
- TE-Post-Load: KV blocks from offline-profiled sizes (the slot's `hbm_blocks`, priced by the
  performance model), allocated asynchronously by the RTC executor as it starts; one dummy
  request warms the engine up (a real forward pass on the TE's NPUs).
- Scaler-Post: the manager pushes the new TE to every JE when it registers (proactive pushing).

A pool's size is a policy: `fixed` (what a launch took is refilled, after its cold cost, to the
set size) or `predicted` (pods and masters: the refill target is the demand of the last
`predict_window_s`, at least the set size and at most `pool_max` — a burst of scale-outs grows
the pool for the next one; a server's executors stay at the set size, bounded by its NPUs).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

Seconds = Annotated[float, msgspec.Meta(ge=0, le=3600)]
Count = Annotated[int, msgspec.Meta(ge=0, le=100_000)]


class Scaling(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[scaling]`: off by default — every boot then runs as before (cold, logs unchanged)."""

    enabled: bool = False
    # Scaler-Pre: pre-warmed pods, shared across models and groups
    pod_pool: Count = 0
    pod_attach_s: Seconds = 0.1  # assumption: binding a running, workload-independent pod
    # TE-Pre-Load: pre-warmed SPMD executors per server (at most its NPUs) and masters (cluster)
    executor_pool_per_server: Annotated[int, msgspec.Meta(ge=0, le=64)] = 0
    master_pool: Count = 0
    te_attach_s: Seconds = 0.2  # assumption: model-specific parameters onto a pre-warmed TE
    # A cold TE-Pre-Load, from published measurements of vLLM 0.10.1.1 starting Llama-2-7B TP1 on
    # an A100 ("Breaking the Ice: Analyzing Cold Start Latency in vLLM", MLSys 2026, arXiv
    # 2606.07362; data: github.com/upb-cn/vllm-startup-profiler, experiments/A100/examples/
    # model_size/avg_comparison_results.json, mean of 5 runs). docs/scaling.md has the table.
    python_init_s: Seconds = 8.6  # its framework_bootstrap without worker_init: platform 0.2 + imports 1.6 + model info 6.8
    npu_init_s: Seconds = 1.8  # its worker_init: device and (world size 1) distributed-environment init
    hccl_init_s: Seconds = 0.0  # TP1 sets up no communicator beyond worker_init; TP>1: see docs/scaling.md
    # Contention when a host cold-starts several TEs at once: vllm-ascend issue #1228 reports a
    # DP8 TP1 launch whose 8 engine processes start one after another, serialised by `import
    # torch_npu`. On: each cold start waits for the import of those already starting on its server.
    import_serial: bool = False
    python_import_s: Seconds = 1.6  # the serialised part: the measurement above's imports (llm_imports)
    pool_policy: Literal["fixed", "predicted"] = "fixed"
    predict_window_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 60.0
    pool_max: Count = 1024  # `predicted`: a pool never grows beyond this
    # TE-Load
    fork: bool = False  # NPU-fork from a running TE of the model when there is one
    fork_gather_s: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.05  # requests this close: one broadcast
    dram_preload: Literal["off", "spare"] = "off"  # pre-load the model of each group's spare slots
    dram_preload_servers: Count = 0  # per group, the first N servers of its spare slots (0: all)
    # TE-Post-Load
    warmup: bool = True  # one dummy request before the TE registers

    def cold_pre_load_s(self) -> float:
        return self.python_init_s + self.npu_init_s + self.hccl_init_s


class Pools(msgspec.Struct, kw_only=True):
    """What the pod launcher holds ready now (its state's `pools`)."""

    pods: int = 0
    masters: int = 0
    executors: dict[str, int] = {}  # str(server) -> pre-warmed executors there
    demand: list[tuple[float, str]] = []  # (when, kind) a launch wanted a unit, taken or not (the predictor's input)


class BootPlan(msgspec.Struct, frozen=True, kw_only=True):
    """One launch's choices for Scaler-Pre and TE-Pre-Load."""

    pod_from_pool: bool
    scaler_pre_s: float
    te_prewarmed: bool
    te_pre_load_s: float
    pre_load_detail: str


def initial_pools(cfg: Scaling, servers: tuple[int, ...]) -> Pools:
    return Pools(pods=cfg.pod_pool, masters=cfg.master_pool,
                 executors={str(s): cfg.executor_pool_per_server for s in sorted(set(servers))})  # fmt: skip


def plan_boot(cfg: Scaling, pools: Pools, server: int, executors: int, masters: int, pod_start_s: float,
              python_real: bool = False, queued: int = 0) -> BootPlan:  # fmt: skip
    """Take from the pools what this launch can (a pure decision; the caller records it).
    `python_real`: the Python start is a real process's, measured and recorded on its own
    (processes mode: `python_start`), so a cold TE-Pre-Load models only NPU and HCCL init."""
    pod = pools.pods > 0
    warm = pools.masters >= masters and pools.executors.get(str(server), 0) >= executors
    cold_s = cfg.npu_init_s + cfg.hccl_init_s if python_real else cfg.cold_pre_load_s()
    wait_s = queued * cfg.python_import_s if cfg.import_serial and not python_real else 0.0
    if warm:
        detail = f"pre-warmed: {executors} executor(s) + {masters} master(s) packed, model bound"
    elif python_real:
        detail = (f"cold: python start real (step python_start) + NPU init {cfg.npu_init_s:g} s + "
                  f"HCCL {cfg.hccl_init_s:g} s")  # fmt: skip
    else:
        detail = (f"cold: python {cfg.python_init_s:g} s + NPU init {cfg.npu_init_s:g} s + "
                  f"HCCL {cfg.hccl_init_s:g} s")  # fmt: skip
        if wait_s:
            detail += f" + import queue {queued} x {cfg.python_import_s:g} s (serialised per host)"
    return BootPlan(pod_from_pool=pod, scaler_pre_s=cfg.pod_attach_s if pod else pod_start_s,
                    te_prewarmed=warm, te_pre_load_s=cfg.te_attach_s if warm else cold_s + wait_s,
                    pre_load_detail=detail)  # fmt: skip


def refill_target(cfg: Scaling, kind: str, now_s: float, demand: list[tuple[float, str]]) -> int:
    """How many units of `kind` the pool should hold (per server for executors)."""
    base = {"pod": cfg.pod_pool, "master": cfg.master_pool, "executor": cfg.executor_pool_per_server}[kind]
    if cfg.pool_policy == "fixed" or kind == "executor":  # a server's executors: bounded by its NPUs
        return base
    recent = sum(1 for at, k in demand if k == kind and at > now_s - cfg.predict_window_s)
    return min(max(base, recent), max(base, cfg.pool_max))


STEPS = ("scaler_pre", "te_pre_load", "te_load", "te_post_load", "scaler_post")


def breakdown(tes: dict[str, Any], since_s: float = 0.0) -> dict[str, Any]:
    """DeepServe Fig. 9's breakdown from the manager's records (`CmState.tes`, live or as `replay
    state` folds them, objects or their `to_builtins` dicts): the TEs launched at or after
    `since_s` that booted through the pipeline and registered — per-step mean seconds (Scaler-Post
    is `registered` minus the four boot steps: the push's own latency), each TE's steps, and
    TE-Load's paths (dram-hit / dram-miss / npu-fork-*) counted."""
    rows: dict[str, dict[str, float]] = {}
    paths: dict[str, int] = {}
    for te, r in sorted(tes.items()):
        rec: dict[str, Any] = r if isinstance(r, dict) else {k: getattr(r, k) for k in ("steps", "details", "launched_s")}
        steps: dict[str, float] = dict(rec["steps"])
        details: dict[str, str] = dict(rec["details"])
        if float(rec["launched_s"]) < since_s or "registered" not in steps or "te_pre_load" not in steps:
            continue  # not launched since, not registered, or resident (nothing booted)
        row = {"scaler_pre": float(steps.get("scaler_pre", steps.get("pod_start", 0.0))),
               "te_pre_load": float(steps["te_pre_load"]),
               # the boot before the pipeline: SSD → DRAM then DRAM → NPU, no warm-up
               "te_load": float(steps.get("te_load", steps.get("ssd_to_dram", 0.0) + steps.get("dram_to_npu", 0.0))),
               "te_post_load": float(steps.get("te_post_load", steps.get("post_load", 0.0)))}  # fmt: skip
        if "python_start" in steps:  # processes mode: the real process start, measured
            row["python_start"] = float(steps["python_start"])
        row["scaler_post"] = max(0.0, float(steps["registered"]) - sum(row.values()))
        row["total"] = float(steps["registered"])
        rows[te] = row
        path = str(details.get("te_load", details.get("ssd_to_dram", ""))).split(" ")[0].rstrip(";")
        path = "dram-miss" if path == "ssd" else path
        paths[path] = paths.get(path, 0) + 1
    n = len(rows)
    means = {k: (sum(r[k] for r in rows.values()) / n if n else 0.0) for k in (*STEPS, "total")}
    real = [r["python_start"] for r in rows.values() if "python_start" in r]
    if real:
        means["python_start"] = sum(real) / len(real)
    return {"tes": n, "step_means_s": means, "te_load_paths": paths, "per_te": rows}
