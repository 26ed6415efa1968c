"""`deepserve bench autoscale` (issue 34 §6): each autoscaling policy beside its baseline, both
simulated in the same run on the same trace and seed.

- `burst_slo_attainment`: configs/scenarios/burst-autoscale.toml (the Azure conversation trace at
  4x on one TE sized for 1x) with the autoscaler on vs off; also the scale-outs and how long SLO
  attainment stayed below `RECOVERED` (per `WINDOW_S` window of arrivals).
- `pd_ratio_goodput`: a P/D cluster on a workload whose output lengths shift halfway (short, then
  long): the P/D ratio adjusted online (P/D-Serve §3.3) vs fixed; goodput = requests within the
  SLO per second of the run.
- `role_switch_slo_attainment`: a P/D cluster on a bursty trace, dynamic role switching (xLLM
  §3.2) vs the static split (the Azure conversation trace at 8x on 1P3D); flips counted, and
  TE loads after the start (weight loads), which stay 0: a flip is membership only.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

WINDOW_S = 5.0
RECOVERED = 0.9  # a window of arrivals counts as recovered at this attainment


class Row(msgspec.Struct, kw_only=True):
    name: str
    value: float  # the policy's
    baseline: float  # the same run's baseline (autoscaler off / fixed ratio / static split)
    unit: str
    detail: dict[str, Any] = {}


def attained(d: Any, ttft_ms: float, tpot_ms: float) -> bool:
    """A `RequestDone` within both SLOs (as `sim`'s slo_attainment counts it)."""
    if d.status != "completed" or d.first_token_s is None:
        return False
    if (d.first_token_s - d.arrival_s) * 1e3 > ttft_ms:
        return False
    return d.output_tokens <= 1 or (d.finish_s - d.first_token_s) * 1e3 / (d.output_tokens - 1) <= tpot_ms


def windows(dones: Sequence[Any], ttft_ms: float, tpot_ms: float, window_s: float = WINDOW_S) -> list[tuple[float, float]]:
    """(window start, SLO attainment of the requests that arrived in it), in time order."""
    w: dict[int, list[int]] = {}
    for d in dones:
        cell = w.setdefault(int(d.arrival_s // window_s), [0, 0])
        cell[0] += attained(d, ttft_ms, tpot_ms)
        cell[1] += 1
    return [(k * window_s, a / n) for k, (a, n) in sorted(w.items())]


def below_s(wins: Sequence[tuple[float, float]], target: float = RECOVERED, window_s: float = WINDOW_S) -> float:
    """From the first window under `target` to the end of the last one (0: never under): how long
    attainment took to recover for good (the whole run's rest when it never did)."""
    under = [t for t, a in wins if a < target]
    return under[-1] + window_s - under[0] if under else 0.0


def _run(cfg: Any) -> tuple[dict[str, Any], list[Any]]:
    from deepserve.cluster import sim

    dones: list[Any] = []
    return sim.run(cfg, on_done=dones.append).summary, dones


def burst_row(overrides: Sequence[str] = ()) -> Row:
    from deepserve.cluster import config

    out: dict[bool, tuple[dict[str, Any], list[Any]]] = {}
    for on in (True, False):
        cfg = config.load("burst-autoscale", ["log=none", *overrides, f"autoscale.enabled={str(on).lower()}"])
        out[on] = _run(cfg)
    slo = cfg.slo
    rec = {on: below_s(windows(d, slo.ttft_ms, slo.tpot_ms)) for on, (_, d) in out.items()}
    s_on, s_off = out[True][0], out[False][0]
    return Row(name="burst_slo_attainment", value=s_on["slo_attainment"], baseline=s_off["slo_attainment"],
               unit="fraction", detail={"scale_outs": s_on["scale_outs"], "scale_ins": s_on.get("scale_ins", 0),
                                        "below_target_s": rec[True], "below_target_s_off": rec[False],
                                        "duration_s": s_on["duration_s"], "duration_s_off": s_off["duration_s"]})  # fmt: skip


def shifting_trace(path: Path, requests: int, rps: float, prompt: int, short: int, long: int) -> Path:
    """An Azure-format CSV: `requests` arrivals at `rps`, output `short` tokens for the first half
    and `long` after (a content change, P/D-Serve §3.3)."""
    t0 = datetime(2026, 1, 1)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(requests):
        at = t0 + timedelta(seconds=i / rps)
        lines.append(f"{at:%Y-%m-%d %H:%M:%S.%f}0,{prompt},{short if i < requests // 2 else long}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


PD_BASE = {
    "name": "pd-autoscale", "seed": 0, "log": "none",
    "cluster": {"hardware": "910b", "topology": "gen1", "model": "llama3-8b", "mode": "pd", "tp": 1, "dp_groups": 1,
                "kv_block_tokens": 128, "link": "roce", "kv_transfer": "contiguous",
                "scheduler": {"max_batch_tokens": 8192, "max_running": 256, "chunked_prefill": True}},
    "control": {"spare_tes": 0},
}  # fmt: skip


def pd_config(p: int, d: int, trace: str, autoscale: dict[str, Any], slo: dict[str, float], rps_scale: float = 1.0,
              requests: int = 0) -> Any:
    from deepserve.cluster.config import validated

    doc = msgspec.json.decode(msgspec.json.encode(PD_BASE))
    doc["cluster"].update(prefill_tes=p, decode_tes=d)
    doc["workload"] = {"trace": trace, "rps_scale": rps_scale, "requests": requests}
    doc["autoscale"], doc["slo"] = autoscale, slo
    return validated(doc)


def goodput(summary: dict[str, Any]) -> float:
    return summary["slo_attainment"] * summary["requests"] / summary["duration_s"] if summary["duration_s"] else 0.0


PD_RATIO = {"enabled": True, "policies": ["pd_ratio"], "ratio_source": "online", "window_s": 5.0, "min_decode": 1,
            "min_prefill": 1, "e2e_rise": 0.2, "share_delta": 0.05}  # fmt: skip
PD_SLO = {"ttft_ms": 2000.0, "tpot_ms": 100.0}


def pd_ratio_row(tmp: Path, requests: int = 600, other_splits: bool = True) -> Row:
    """Adjusted from 2P2D vs fixed at 2P2D; with `other_splits`, the other fixed splits' goodput
    too (in hindsight one of them may suit the whole trace better than either)."""
    trace = shifting_trace(tmp / "shift.csv", requests, rps=22.0, prompt=2048, short=16, long=300)
    on = _run(pd_config(2, 2, str(trace), PD_RATIO, PD_SLO))[0]
    off = _run(pd_config(2, 2, str(trace), {"enabled": False}, PD_SLO))[0]
    detail = {"flips": on.get("flips", 0), "failed": on["failed"], "slo_attainment": on["slo_attainment"],
              "slo_attainment_fixed": off["slo_attainment"], "split": "2P2D at start"}  # fmt: skip
    for p, d in ((3, 1), (1, 3)) if other_splits else ():
        detail[f"fixed_{p}p{d}d"] = goodput(_run(pd_config(p, d, str(trace), {"enabled": False}, PD_SLO))[0])
    return Row(name="pd_ratio_goodput", value=goodput(on), baseline=goodput(off), unit="req/s within SLO",
               detail=detail)


ROLE_SWITCH = {"enabled": True, "policies": ["role_switch"], "interval_s": 0.5, "min_decode": 2, "min_prefill": 1,
               "flip_cooldown_s": 2.0, "ttft_headroom": 0.5}  # fmt: skip


def role_switch_row(trace: str = "builtin:azure_conv_500", rps_scale: float = 8.0, requests: int = 0) -> Row:
    on = _run(pd_config(1, 3, trace, ROLE_SWITCH, PD_SLO, rps_scale, requests))[0]
    off = _run(pd_config(1, 3, trace, {"enabled": False}, PD_SLO, rps_scale, requests))[0]
    # the split that suits this trace, for scale: switching from it must not lose to it
    on_22 = _run(pd_config(2, 2, trace, ROLE_SWITCH, PD_SLO, rps_scale, requests))[0]
    off_22 = _run(pd_config(2, 2, trace, {"enabled": False}, PD_SLO, rps_scale, requests))[0]
    return Row(name="role_switch_slo_attainment", value=on["slo_attainment"], baseline=off["slo_attainment"],
               unit="fraction", detail={"flips": on.get("flips", 0), "te_loads": on["te_loads_after_start"], "failed": on["failed"],
                                        "split": "1P3D static", "trace": f"{trace} at {rps_scale:g}x",
                                        "from_2p2d": on_22["slo_attainment"], "static_2p2d": off_22["slo_attainment"],
                                        "flips_from_2p2d": on_22.get("flips", 0)})  # fmt: skip


def gap_trace(path: Path, per_burst: int, gap_s: float, prompt: int = 512, output: int = 64) -> Path:
    """Two bursts of `per_burst` requests (10 a second), `gap_s` of silence between them."""
    t0 = datetime(2026, 1, 1)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(2 * per_burst):
        at = t0 + timedelta(seconds=i / 10 + (gap_s if i >= per_burst else 0.0))
        lines.append(f"{at:%Y-%m-%d %H:%M:%S.%f}0,{prompt},{output}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def to_zero_config(trace: str, keep_alive_s: float) -> Any:
    from deepserve.cluster.config import validated

    doc = msgspec.json.decode(msgspec.json.encode(PD_BASE))
    doc["cluster"].update(mode="colocated", tes=1)
    doc["workload"] = {"trace": trace}
    doc["autoscale"] = {"enabled": True, "min_tes": 0, "keep_alive_s": keep_alive_s, "interval_s": 0.5}
    return validated(doc)


def scale_to_zero_row(tmp: Path, gap_s: float = 30.0) -> Row:
    """The first request after an idle gap: its TTFT when the model was scaled to zero after
    `keep_alive_s` = 5 s (a cold start: pod, TE-Pre-Load, SSD -> DRAM -> NPU) vs kept warm."""
    trace = str(gap_trace(tmp / "gap.csv", 20, gap_s))
    out = {}
    for keep in (5.0, 2 * gap_s):
        summary, dones = _run(to_zero_config(trace, keep))
        first = min((d for d in dones if d.arrival_s >= gap_s), key=lambda d: d.arrival_s)
        ttft_s = first.first_token_s - first.arrival_s if first.first_token_s is not None else float("nan")
        out[keep] = (ttft_s, summary)
    (cold, s_cold), (warm, _) = out[5.0], out[2 * gap_s]
    return Row(name="scale_to_zero_first_ttft_s", value=cold, baseline=warm, unit="s (emulated)",
               detail={"scale_ins": s_cold.get("scale_ins", 0), "scale_outs": s_cold["scale_outs"],
                       "failed": s_cold["failed"], "gap_s": gap_s, "keep_alive_s": 5.0})  # fmt: skip


ROWS: dict[str, Callable[[Path], Row]] = {
    "burst_slo_attainment": lambda _tmp: burst_row(),
    "pd_ratio_goodput": pd_ratio_row,
    "role_switch_slo_attainment": lambda _tmp: role_switch_row(),
    "scale_to_zero_first_ttft_s": scale_to_zero_row,
}


def run(names: Sequence[str] = tuple(ROWS)) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="deepserve-autoscale-") as tmp:
        return [ROWS[n](Path(tmp)) for n in names]


def scaling_rows(**_: Any) -> list[dict[str, Any]]:
    """The rows in `deepserve bench scaling`'s shape (benchmarks/scaling.py `ROWS`: name, value,
    the baseline's name and value, details), for that suite to append."""
    base = {"burst_slo_attainment": "autoscaler_off", "pd_ratio_goodput": "fixed_2p2d",
            "role_switch_slo_attainment": "static_1p3d", "scale_to_zero_first_ttft_s": "kept_warm"}  # fmt: skip
    return [{"name": r.name, "value": r.value, "baseline": base[r.name], "baseline_value": r.baseline,
             "unit": r.unit, **r.detail} for r in run()]  # fmt: skip
