"""The report's charts (plotly figures) from a run's `Facts`: the cluster timeline (a lane per
TE: how busy its NPU was, its KV blocks in use, boots, faults, declarations, recoveries), the
latency distributions, and SLO attainment and throughput over time.

Busy time and KV usage are binned (`BINS` over the run): a Mooncake hour is ~30k batches per TE,
which a browser would draw as 500k shapes; a heatmap cell per TE and bin reads the same at a
glance and keeps the page light. Everything per request (latencies) is drawn whole.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .report_facts import Facts, TeLane

BINS = 240
FONT = "Inter, 'Segoe UI', Helvetica, Arial, sans-serif"
COLORS = {"injected": "#d62728", "declared_failed": "#ff7f0e", "recovered": "#2ca02c", "boot": "#9467bd"}
SYMBOLS = {"injected": "x", "declared_failed": "diamond", "recovered": "triangle-up"}
LABELS = {"injected": "fault injected", "declared_failed": "TE declared failed", "recovered": "replacement ready"}


def _layout(fig: go.Figure, height: int, title: str) -> go.Figure:
    fig.update_layout(template="plotly_white", height=height, font={"family": FONT, "size": 12},
                      title={"text": title, "x": 0.01, "font": {"size": 16}},
                      margin={"l": 70, "r": 30, "t": 60, "b": 40},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"})  # fmt: skip
    return fig


def edges(facts: Facts) -> np.ndarray:
    end = facts.end_t if facts.end_t > 0 else 1.0
    return np.linspace(0.0, end, BINS + 1)


def lane_order(facts: Facts) -> list[str]:
    def key(te: str) -> tuple[int, str]:
        tail = te.rsplit("/", 1)[-1]
        return (int(tail), te) if tail.isdigit() else (math.inf, te)  # type: ignore[return-value]

    return sorted(facts.lanes, key=key)


def busy_fraction(lane: TeLane, e: np.ndarray) -> np.ndarray:
    """Per bin, the share of it the TE's NPU spent on batches (each batch split over the bins
    it spans)."""
    busy = np.zeros(len(e) - 1)
    if not lane.batch_start:
        return busy
    start, end = np.frombuffer(lane.batch_start, float), np.frombuffer(lane.batch_end, float)
    end = np.maximum(end, start)
    # the integral of "a batch is running" at every edge, by sorted starts and ends
    cum_at = _covered_until(start, end, e)
    width = np.diff(e)
    return np.clip(np.diff(cum_at) / np.where(width > 0, width, 1.0), 0.0, 1.0)


def _covered_until(start: np.ndarray, end: np.ndarray, x: np.ndarray) -> np.ndarray:
    """For each x, the summed time batches ran before x: sum(clip(x - start, 0, end - start))."""
    s, d = np.sort(start), np.sort(end)
    cs, cd = np.concatenate([[0.0], np.cumsum(s)]), np.concatenate([[0.0], np.cumsum(d)])
    ns, nd = np.searchsorted(s, x, "right"), np.searchsorted(d, x, "right")
    # started before x: (x - start); of those ended before x: minus (x - end)
    return (x * ns - cs[ns]) - (x * nd - cd[nd])


def kv_percent(lane: TeLane, e: np.ndarray) -> np.ndarray:
    """Per bin, the most KV blocks the TE's sequences held (% of its HBM pool when known)."""
    out = np.full(len(e) - 1, np.nan)
    if lane.kv_t:
        t, used = np.frombuffer(lane.kv_t, float), np.frombuffer(lane.kv_used, np.int32).astype(float)
        idx = np.clip(np.searchsorted(e, t, "right") - 1, 0, len(out) - 1)
        np.fmax.at(out, idx, used)
        # a bin with no change holds what the last change before it left
        last = 0.0
        for i in range(len(out)):
            # the level carried into the bin counts too (a bin where usage only fell)
            out[i] = last if np.isnan(out[i]) else max(out[i], last)
            last_idx = np.searchsorted(t, e[i + 1], "right") - 1
            last = used[last_idx] if last_idx >= 0 else 0.0
    else:
        out[:] = 0.0
    return 100.0 * out / lane.kv_capacity if lane.kv_capacity else out


def timeline(facts: Facts) -> go.Figure:
    lanes = lane_order(facts)
    e = edges(facts)
    mid = (e[:-1] + e[1:]) / 2
    pct = any(facts.lanes[te].kv_capacity for te in lanes)
    unit = "% of HBM blocks" if pct else "blocks"
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.09,
                        subplot_titles=("NPU busy (share of each interval) · boots, faults, recoveries",
                                        f"KV cache in use ({unit}, the most in each interval)"))  # fmt: skip
    busy = np.array([busy_fraction(facts.lanes[te], e) for te in lanes]) if lanes else np.zeros((0, len(mid)))
    kv = np.array([kv_percent(facts.lanes[te], e) for te in lanes]) if lanes else np.zeros((0, len(mid)))
    fig.add_trace(go.Heatmap(x=mid, y=lanes, z=busy * 100, zmin=0, zmax=100, colorscale="Blues", name="busy",
                             colorbar={"title": "busy %", "len": 0.42, "y": 0.79, "thickness": 12},
                             hovertemplate="%{y} at t≈%{x:.1f}s: busy %{z:.0f}%<extra></extra>"), row=1, col=1)  # fmt: skip
    fig.add_trace(go.Heatmap(x=mid, y=lanes, z=kv, zmin=0, colorscale="YlOrRd", name="KV",
                             colorbar={"title": "KV %" if pct else "blocks", "len": 0.42, "y": 0.21, "thickness": 12},
                             hovertemplate="%{y} at t≈%{x:.1f}s: %{z:.1f}" + ("%" if pct else " blocks") + "<extra></extra>"),
                  row=2, col=1)  # fmt: skip
    _boots(fig, facts)
    _markers(fig, facts, lanes)
    for row in (1, 2):
        fig.update_yaxes(autorange="reversed", type="category", row=row, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig = _layout(fig, max(520, 240 + 44 * len(lanes)), "Cluster timeline · a lane per TE")
    fig.update_layout(margin={"t": 100}, legend={"y": 1.07})
    return fig


def _boots(fig: go.Figure, facts: Facts) -> None:
    """A boot as a bar on its TE's lane from launch to ready (to the end if it never was)."""
    xs: list[float | None] = []
    ys: list[str | None] = []
    for b in facts.boots:
        end = b["ready_s"] if b["ready_s"] is not None else facts.end_t
        if end <= b["start_s"]:
            continue  # a resident TE, up at t=0
        xs += [b["start_s"], end, None]
        ys += [b["te"], b["te"], None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="booting", line={"width": 9, "color": COLORS["boot"]},
                                 opacity=0.75, hoverinfo="skip"), row=1, col=1)  # fmt: skip


def _markers(fig: go.Figure, facts: Facts, lanes: list[str]) -> None:
    for cat, label in LABELS.items():
        rows = [f for f in facts.faults if f["category"] == cat]
        if not rows:
            continue
        fig.add_trace(go.Scatter(
            x=[f["t"] for f in rows], y=[_lane_of(facts, f, lanes) for f in rows],
            mode="markers", name=label, customdata=[f"{f['kind']} → {f['target']}: {f['detail'][:160]}" for f in rows],
            marker={"symbol": SYMBOLS[cat], "size": 14, "color": COLORS[cat], "line": {"width": 1.5, "color": "white"}},
            hovertemplate="t=%{x:.3f}s %{customdata}<extra></extra>"), row=1, col=1)  # fmt: skip
    for f in facts.faults:
        if f["category"] == "injected":
            fig.add_vline(x=f["t"], line={"color": COLORS["injected"], "width": 1, "dash": "dot"})


def _lane_of(facts: Facts, fault: dict[str, Any], lanes: list[str]) -> str:
    """A fault's lane: its TE's; a fault on hardware (an NPU, a link) goes on the lane of the TE
    the control plane declared failed next, before another fault was injected."""
    if fault["te"] in facts.lanes:
        return str(fault["te"])
    for g in facts.faults:
        if g["t"] >= fault["t"] and g is not fault and g["category"] == "injected":
            break
        if g["t"] >= fault["t"] and g["category"] == "declared_failed" and g["te"] in facts.lanes:
            return str(g["te"])
    return lanes[0] if lanes else ""


def distributions(facts: Facts) -> go.Figure:
    """Histograms on log-spaced bins (a log x axis): TTFT spans 20 ms to minutes in an incident."""
    done = [r for r in facts.requests.values() if r["status"] == "completed"]
    series = [(k, t, c, np.array([r[k] for r in done if r[k] is not None and r[k] > 0]))
              for k, t, c in (("ttft_ms", "TTFT", "#3b5bdb"), ("tpot_ms", "TPOT", "#9467bd"), ("e2e_ms", "end-to-end", "#12b886"))]  # fmt: skip
    titles = [f"{t} (ms)" + (f" · p50 {np.percentile(v, 50):,.1f} · p99 {np.percentile(v, 99):,.1f}" if len(v) else "")
              for _, t, _, v in series]  # fmt: skip
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.07)
    slo = {"ttft_ms": facts.slo_ttft_ms, "tpot_ms": facts.slo_tpot_ms}
    for col, (key, _, color, values) in enumerate(series, 1):
        if len(values):
            lo, hi = np.log10(values.min()), np.log10(values.max())
            bins = np.logspace(lo, hi if hi > lo else lo + 1, 41)
            counts, _ = np.histogram(values, bins)
            # a step outline filled to zero: bars on a log axis would take the narrowest bin's width
            fig.add_trace(go.Scatter(x=bins, y=np.append(counts, counts[-1]), mode="lines", line_shape="hv",
                                     fill="tozeroy", line={"color": color, "width": 1.5}, showlegend=False, name=key,
                                     hovertemplate="from %{x:,.1f} ms: %{y} requests<extra></extra>"), row=1, col=col)  # fmt: skip
            for q, dash in ((50, "dash"), (99, "dot")):
                fig.add_vline(x=float(np.percentile(values, q)), line={"color": "#333", "dash": dash, "width": 1}, row=1, col=col)
        if key in slo:  # (no annotation: on a log axis plotly would place its text at 10^x)
            fig.add_vline(x=slo[key], line={"color": COLORS["injected"], "width": 2}, row=1, col=col)
        fig.update_xaxes(type="log", row=1, col=col)
    fig.update_yaxes(title_text="requests", row=1, col=1)
    fig.update_annotations(font_size=12)
    return _layout(fig, 360, "Latency distributions (completed requests; dashed p50, dotted p99, red the SLO)")


def over_time(facts: Facts) -> go.Figure:
    """By finish time: SLO attainment of the requests that ended in each bin, completed requests/s
    and output tokens/s."""
    e = edges(facts)
    mid, width = (e[:-1] + e[1:]) / 2, np.diff(e)
    rows = list(facts.requests.values())
    fin = np.array([r["finish_s"] for r in rows], float)
    idx = np.clip(np.searchsorted(e, fin, "right") - 1, 0, BINS - 1)
    ended = np.bincount(idx, minlength=BINS).astype(float)
    met = np.bincount(idx, weights=[float(r["slo_met"]) for r in rows], minlength=BINS) if rows else np.zeros(BINS)
    done = np.array([r["status"] == "completed" for r in rows], float)
    completed = np.bincount(idx, weights=done, minlength=BINS) if rows else np.zeros(BINS)
    tokens = np.bincount(idx, weights=[r["output_tokens"] * d for r, d in zip(rows, done, strict=True)],
                         minlength=BINS) if rows else np.zeros(BINS)  # fmt: skip
    attain = np.where(ended > 0, 100.0 * met / np.where(ended > 0, ended, 1), np.nan)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, specs=[[{}], [{"secondary_y": True}]],
                        subplot_titles=(f"SLO attainment (TTFT ≤ {facts.slo_ttft_ms:g} ms and TPOT ≤ {facts.slo_tpot_ms:g} ms)",
                                        "Throughput"))  # fmt: skip
    fig.add_trace(go.Scatter(x=mid, y=attain, mode="lines", fill="tozeroy", line={"color": "#2ca02c", "width": 2},
                             fillcolor="rgba(44,160,44,0.15)", name="SLO attainment", connectgaps=False,
                             hovertemplate="t≈%{x:.1f}s: %{y:.1f}%<extra></extra>"), row=1, col=1)  # fmt: skip
    fig.add_trace(go.Bar(x=mid, y=completed / width, name="completed req/s", marker={"color": "#1f77b4"}, opacity=0.7,
                         hovertemplate="t≈%{x:.1f}s: %{y:.2f} req/s<extra></extra>"), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=mid, y=tokens / width, name="output tokens/s", mode="lines",
                             line={"color": "#ff7f0e", "width": 2},
                             hovertemplate="t≈%{x:.1f}s: %{y:,.0f} tok/s<extra></extra>"), row=2, col=1, secondary_y=True)  # fmt: skip
    for f in facts.faults:
        if f["category"] == "injected":
            fig.add_vline(x=f["t"], line={"color": COLORS["injected"], "width": 1, "dash": "dot"})
    fig.update_yaxes(range=[0, 105], ticksuffix="%", row=1, col=1)
    fig.update_yaxes(title_text="req/s", rangemode="tozero", row=2, col=1, secondary_y=False)
    fig.update_yaxes(title_text="tokens/s", row=2, col=1, secondary_y=True, showgrid=False, rangemode="tozero")
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    return _layout(fig, 520, "SLO attainment and throughput over time")


def per_request(facts: Facts) -> go.Figure:
    """Every request at its arrival: its TTFT (met the SLO or not), or, failed, how long it took
    to fail. An incident shows as a column of late or red points after its fault line."""
    rows = sorted(facts.requests.values(), key=lambda r: r["arrival_s"])
    fig = go.Figure()
    groups = (("met the SLO", "#2f9e44", "circle", lambda r: r["status"] == "completed" and r["slo_met"], "ttft_ms"),
              ("missed the SLO", "#f59f00", "circle", lambda r: r["status"] == "completed" and not r["slo_met"], "ttft_ms"),
              ("failed (time to failure)", COLORS["injected"], "x", lambda r: r["status"] != "completed", "e2e_ms"))  # fmt: skip
    for name, color, symbol, keep, key in groups:
        sel = [r for r in rows if keep(r) and r[key] is not None and r[key] > 0]
        if not sel:
            continue
        fig.add_trace(go.Scatter(
            x=[r["arrival_s"] for r in sel], y=[r[key] for r in sel], mode="markers", name=f"{name} ({len(sel):,})",
            customdata=[[r["request_id"], r["te"] or "-", r["reason"][:80]] for r in sel],
            marker={"color": color, "symbol": symbol, "size": 5 if symbol == "circle" else 8, "opacity": 0.6},
            hovertemplate="%{customdata[0]} on %{customdata[1]}: %{y:,.1f} ms at t=%{x:.2f}s<br>%{customdata[2]}<extra></extra>"))  # fmt: skip
    fig.add_hline(y=facts.slo_ttft_ms, line={"color": COLORS["injected"], "width": 1, "dash": "dash"})
    for f in facts.faults:
        if f["category"] == "injected":
            fig.add_vline(x=f["t"], line={"color": COLORS["injected"], "width": 1, "dash": "dot"})
    fig.update_yaxes(type="log", title_text="TTFT (ms)")
    fig.update_xaxes(title_text="arrival time (s)")
    return _layout(fig, 380, f"Every request's TTFT by arrival (dashed: the TTFT SLO, {facts.slo_ttft_ms:g} ms)")


def figures(facts: Facts) -> dict[str, Any]:
    """The page's figures by element id, in page order."""
    return {"chart-timeline": timeline(facts), "chart-requests": per_request(facts),
            "chart-latency": distributions(facts), "chart-time": over_time(facts)}  # fmt: skip
