"""`deepserve profile heatmap`: DeepServe Fig. 6 on the emulator — for each (prefill length,
decode/prefill ratio, RPS) a batch of identical requests runs once on a PD pair (1P1D) and once
on two colocated TEs (chunked prefill) of the same model, on the same number of NPUs. A cell's
value is JCT(colocated) / JCT(PD) - 1 (p50 over the batch): > 0 means PD-disaggregated was
faster. The scheduler's heatmap is the element-wise sum over the RPS values (DeepServe §5.3.2).
Each cell is measured at its lower corner (the edge values), which is what a lookup finds.

Requests are written as a small Azure-format CSV (unique prompts: no prefix sharing, so the
comparison is about PD interference only) and run through the normal scenario path with the
gateway and a round-robin JE.
"""

from __future__ import annotations

import datetime as dt
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from deepserve.actors.scheduling import PdHeatmap
from deepserve.adapters.scenario.sched import Scheduling
from deepserve.cluster.run import run_scenario

from .policies import ClusterSpec, build_mixed, scenario_of

PREFILL_EDGES = (128, 512, 1024, 2048, 4096)
RATIO_EDGES = (0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0)
RPS = (0.5, 1.0, 2.0)
T0 = dt.datetime(2023, 11, 16, 18, 0, 0)


def batch_csv(folder: Path, prefill: int, output: int, rps: float, n: int) -> str:
    path = folder / f"batch-{prefill}-{output}-{rps:g}.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        at = T0 + dt.timedelta(seconds=i / rps)
        rows.append(f"{at.strftime('%Y-%m-%d %H:%M:%S.%f')}0,{prefill},{output}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(path)


def jct_ms(c: ClusterSpec, trace: str, n: int, seed: int) -> tuple[float, str]:
    """(JCT p50 in ms, "" or why requests failed) — a cell whose requests fail is kept, marked."""
    s = scenario_of(c, Scheduling(policy="round_robin"), trace, n, 1.0, seed)
    r = run_scenario(s, build=build_mixed(c))
    failed = n - r.summary["completed"]
    error = f"{failed} of {n} failed on {c.name}: {next(iter(r.summary['failure_reasons']), '')}" if failed else ""
    return float(r.summary["e2e_ms_p50"]), error


def profile_heatmap(model: str = "codellama-34b", tp: int = 4, prefill_edges: tuple[int, ...] = PREFILL_EDGES,
                    ratio_edges: tuple[float, ...] = RATIO_EDGES, rps: tuple[float, ...] = RPS,
                    requests: int = 32, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The heatmap file's content: the summed `heatmap` plus every measured cell."""
    pd = ClusterSpec(name="pd-1p1d", model=model, tp=tp, colocated=0, pairs=1)
    co = ClusterSpec(name="colocated-2", model=model, tp=tp, colocated=2, pairs=0)
    cells: list[dict[str, Any]] = []
    summed = [[0.0] * len(ratio_edges) for _ in prefill_edges]
    with tempfile.TemporaryDirectory(prefix="deepserve-heatmap-") as tmp:
        for i, p in enumerate(prefill_edges):
            for j, ratio in enumerate(ratio_edges):
                out = max(2, round(p * ratio))
                for r in rps:
                    if progress is not None:
                        progress(f"prefill {p}, ratio {ratio:g} ({out} tokens), {r:g} rps")
                    trace = batch_csv(Path(tmp), p, out, r, requests)
                    (jct_pd, err_pd), (jct_co, err_co) = jct_ms(pd, trace, requests, seed), jct_ms(co, trace, requests, seed)
                    error = "; ".join(e for e in (err_pd, err_co) if e)
                    # A side whose requests failed has no comparable JCT: the cell adds nothing.
                    value = 0.0 if error else jct_co / jct_pd - 1.0
                    summed[i][j] += value
                    cells.append({"prefill_tokens": p, "ratio": ratio, "decode_tokens": out, "rps": r,
                                  "jct_ms_pd": jct_pd, "jct_ms_colocated": jct_co, "value": value,
                                  "error": error})
                    if error and progress is not None:
                        progress(f"  cell left at 0: {error}")
    heat = PdHeatmap(prefill_edges=tuple(prefill_edges), ratio_edges=tuple(ratio_edges),
                     values=tuple(tuple(row) for row in summed), model=model, rps=tuple(rps))
    return {"heatmap": msgspec.to_builtins(heat), "cells": cells, "model": model, "tp": tp,
            "requests_per_cell": requests}


def plot_heatmap(data: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = data["heatmap"]
    values = h["values"]
    lim = max((abs(v) for row in values for v in row), default=1.0) or 1.0
    fig, ax = plt.subplots(figsize=(7, 5))
    im = ax.imshow(values, cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower", aspect="auto")
    ax.set_xticks(range(len(h["ratio_edges"])), [f"{r:g}" for r in h["ratio_edges"]])
    ax.set_yticks(range(len(h["prefill_edges"])), [str(p) for p in h["prefill_edges"]])
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:+.2f}", ha="center", va="center", fontsize=8)
    ax.set(xlabel="decode length / prefill length", ylabel="prefill length (tokens)",
           title=f"JCT(colocated)/JCT(PD) - 1, summed over RPS {', '.join(f'{r:g}' for r in h['rps'])}\n"
                 f"{data['model']} TP={data['tp']} (red: PD faster)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
