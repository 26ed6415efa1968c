"""`deepserve bench scaling` (issue 34 §6): fast scaling in emulated seconds (SimDriver).

`scale64_*` rows: one running Llama-3-8B TP1 TE on Gen1 910B servers, then a `ScaleGroup` asks
for 64 more at once (DeepServe's abstract: "scaling 64 TEs in seconds"). Each variant is the same
cluster with a different `[scaling]` section (actors/cluster/prewarm.py):

- prewarm_fork: pre-warmed pods and TEs for all 64, NPU-fork from the running TE (an HCCS
  broadcast inside its server, a RoCE one beyond);
- prewarm_dram: pre-warmed pods and TEs, the model pre-loaded in every spare host's DRAM;
- cold: the pipeline with empty pools, no pre-load, no fork (cold TE-Pre-Load, DRAM miss);
- cold_serial_import: cold, with the `import torch_npu` serialisation per host reported for
  vllm-ascend (`import_serial`: each server's cold starts import one after another);
- today: `[scaling]` off (the boot path before the pipeline: pod start, TE-Pre-Load, SSD → DRAM,
  DRAM → NPU, no warm-up).

A row's value is the scale-out's time: from the request to the last new TE pushed to the JEs.
Each row carries its per-step means (DeepServe Fig. 9's breakdown) and TE-Load's paths. More
rows (w-autoscale's) append to `ROWS`. The cold costs are published measurements (prewarm.py's
`Scaling` fields and `POD_CREATE_S` here; docs/scaling.md lists the sources).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from deepserve.actors.cluster.messages import ScaleGroup
from deepserve.actors.cluster.prewarm import breakdown
from deepserve.cluster.assembly import MANAGER_ADDR, assemble
from deepserve.cluster.config import validated
from deepserve.core import SimDriver
from deepserve.persistence.memory import MemorySink

MODEL = "llama3-8b"
GROUP = f"{MODEL}/colocated"
SCALE_AT_S = 30.0  # after the DRAM pre-loads (a few seconds) and the pools' cold starts
UNTIL_S = SCALE_AT_S + 600.0

PREWARM = {"enabled": True, "pod_pool": 64, "executor_pool_per_server": 8, "master_pool": 64}
VARIANTS: dict[str, dict[str, Any]] = {
    "prewarm_fork": {**PREWARM, "fork": True},
    "prewarm_dram": {**PREWARM, "dram_preload": "spare"},
    "cold": {"enabled": True},
    "cold_serial_import": {"enabled": True, "import_serial": True},
    "today": {},
}
# Scaler-Pre of a created pod, images present: Knative's report of an idle kubeadm cluster,
# "a regular ~2second pod startup time" (github.com/knative/serving/issues/2484), inside
# Kubernetes' pod start-up SLO (p99 <= 5 s excluding image pulls: kubernetes/community,
# sig-scalability/slos/pod_startup_latency.md). `control.pod_start_s`'s default stays 1.0 for
# every other scenario (its logs and tests).
POD_CREATE_S = 2.0


def scale_config(scaling: dict[str, Any], new_tes: int = 64, seed: int = 0, tp: int = 1) -> Any:
    """The scale-out cluster: one running TE, `new_tes` spare slots, no heartbeats, no workload."""
    doc = {"name": "scale-out", "seed": seed, "log": "none",
           "cluster": {"model": MODEL, "tp": tp, "tes": 1, "npu_variance": False},
           "control": {"heartbeats": False, "spare_tes": new_tes, "boot_timeout_s": 3600.0,
                       "pod_start_s": POD_CREATE_S},
           "scaling": scaling}  # fmt: skip
    return validated(doc)


def run_scale_out(scaling: dict[str, Any], new_tes: int = 64, seed: int = 0,
                  setup: Callable[[SimDriver], None] | None = None, size: int | None = None,
                  log: str = "", tp: int = 1) -> dict[str, Any]:  # fmt: skip
    """Run one scale-out of `size` new TEs (default: every one of the `new_tes` spare slots);
    the manager's state says when each TE became ready and its steps. `log`: also write the
    run's log there (SQLite; `deepserve replay state LOG --actor cluster` shows each TE's steps)."""
    cfg = scale_config(scaling, new_tes, seed, tp)
    sink: Any = MemorySink()
    if log:
        from deepserve.persistence import open_sink

        sink = open_sink(log, "async")
    d = SimDriver(seed, sink=sink, config=msgspec.to_builtins(cfg))
    assemble(d, cfg)
    if setup is not None:
        setup(d)
    d.inject(MANAGER_ADDR, ScaleGroup(group=GROUP, size=1 + (new_tes if size is None else size)), at=SCALE_AT_S, src="ext/bench")
    d.run(until=UNTIL_S)
    if log:
        if d.pending():  # the pools' refill timers may still be pending: final states go to the log
            d.snapshot_live()
        sink.close()
    st = d.actor(MANAGER_ADDR).state
    tes = {te: r for te, r in st.tes.items() if r.launched_s >= SCALE_AT_S}
    ready = [r for r in tes.values() if r.state == "ready"]
    out = breakdown(st.tes, since_s=SCALE_AT_S)
    out["ready"] = len(ready)
    out["scale_out_s"] = max((r.since_s for r in ready), default=float("nan")) - SCALE_AT_S
    out["driver"] = d
    return out


def _row(name: str, r: dict[str, Any], base_name: str, base: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "value": round(r["scale_out_s"], 3), "unit": "s (emulated)",
            "baseline": base_name, "baseline_value": round(base["scale_out_s"], 3),
            "tes_ready": r["ready"], "step_means_s": {k: round(v, 3) for k, v in r["step_means_s"].items()},
            "te_load_paths": r["te_load_paths"]}  # fmt: skip


def scale64_rows(log_dir: str = "", new_tes: int = 64) -> list[dict[str, Any]]:
    """`log_dir`: each variant's log as `scale64-<variant>.db` there."""
    runs = {name: run_scale_out(s, new_tes, log=f"{log_dir}/scale64-{name}.db" if log_dir else "")
            for name, s in VARIANTS.items()}  # fmt: skip
    return [
        _row("scale64_prewarm_fork_s", runs["prewarm_fork"], "scale64_cold_s", runs["cold"]),
        _row("scale64_prewarm_dram_s", runs["prewarm_dram"], "scale64_cold_s", runs["cold"]),
        _row("scale64_cold_s", runs["cold"], "scaling off (the boot before the pipeline)", runs["today"]),
        _row("scale64_cold_serial_import_s", runs["cold_serial_import"], "scale64_cold_s", runs["cold"]),
    ]


# Row sets by name; each is called with `log_dir` ("": write no log).
ROWS: dict[str, Callable[..., list[dict[str, Any]]]] = {"scale64": scale64_rows}


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["bench scaling: emulated seconds (SimDriver), Llama-3-8B TP1 on Gen1 910B servers"]
    for r in rows:
        lines.append(f"{r['name']:<30} {r['value']:>8.3f} s   baseline {r['baseline']}: {r['baseline_value']:.3f} s"
                     f"   ({r.get('tes_ready', '-')} TEs ready)")  # fmt: skip
        if "step_means_s" in r:
            steps = "  ".join(f"{k} {v:.3f}" for k, v in r["step_means_s"].items())
            lines.append(f"    step means (s): {steps}")
            lines.append(f"    TE-Load paths: {msgspec.json.encode(r['te_load_paths']).decode()}")
    return "\n".join(lines)
