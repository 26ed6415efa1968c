"""`deepserve replay report LOG -o report.html`: one self-contained HTML page about a run.

The page holds plotly.js inline (no network needed to open it; ~4.8 MB), the charts of
`report_charts.py`, the run's numbers as `deepserve sim --json` computes them, and the incidents:
each injected fault with the control plane's answer (declared failed, replacement ready) and
the requests it hit, each linked to its `replay why` story further down the page; then the
failures and the gateway's refusals, grouped by reason, linked the same way.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from typing import Any

from deepserve.actors.gateway.messages import is_refused
from deepserve.actors.workload.metrics import percentile

from .report_facts import Facts

MAX_WHY = 60  # requests whose whole story the page carries (the rest are named)
PER_GROUP = 4  # stories linked per incident or failure reason
AFTERMATH_S = 5.0  # after a fault with no declaration: the window whose task failures it caused


def summary(facts: Facts) -> dict[str, Any]:
    """The run's numbers with `deepserve sim --json`'s definitions (actors/workload/metrics.py)."""
    rows = list(facts.requests.values())
    done = [r for r in rows if r["status"] == "completed"]
    ttft = sorted(r["ttft_ms"] for r in done if r["ttft_ms"] is not None)
    tpot = sorted(r["tpot_ms"] for r in done if r["tpot_ms"] is not None)
    e2e = sorted(r["e2e_ms"] for r in done)
    span = (max(r["finish_s"] for r in rows) - min(r["arrival_s"] for r in rows)) if rows else 0.0
    out: dict[str, Any] = {
        "requests": len(rows), "completed": len(done), "failed": sum(r["status"] == "failed" for r in rows),
        "refused": sum(is_refused(r["status"], r["reason"]) for r in rows),
        "cancelled": sum(r["status"] == "cancelled" for r in rows),
        "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
        "tpot_ms_p50": percentile(tpot, 50), "tpot_ms_p99": percentile(tpot, 99),
        "e2e_ms_p50": percentile(e2e, 50), "e2e_ms_p99": percentile(e2e, 99),
        "slo_attainment": sum(r["slo_met"] for r in rows) / len(rows) if rows else 0.0,
        "throughput_rps": len(done) / span if span > 0 else 0.0,
        "output_tokens_per_s": sum(r["output_tokens"] for r in done) / span if span > 0 else 0.0,
        "faults_injected": sum(f["category"] == "injected" for f in facts.faults),
        "recoveries": sum(f["category"] == "recovered" for f in facts.faults),
        "decisions": len(facts.decisions), "duration_s": span,
    }  # fmt: skip
    return out


def incidents(facts: Facts) -> list[dict[str, Any]]:
    """Each injected fault with what followed it: the TEs declared failed and made ready again
    before the next fault, and the requests whose task failed meanwhile (or just after, when
    nothing was declared). A TE declared failed with no fault injected before it is an incident
    of its own (a fault the platform found by itself)."""
    faults = sorted(facts.faults, key=lambda f: f["t"])
    injected = [f for f in faults if f["category"] == "injected"]
    out: list[dict[str, Any]] = []
    claimed: set[int] = set()
    for k, f in enumerate(injected):
        until = injected[k + 1]["t"] if k + 1 < len(injected) else float("inf")
        follow = [(i, g) for i, g in enumerate(faults) if g["category"] != "injected" and f["t"] <= g["t"] < until]
        claimed.update(i for i, _ in follow)
        out.append(_incident(facts, f, [g for _, g in follow]))
    for i, g in enumerate(faults):
        if g["category"] == "declared_failed" and i not in claimed:
            out.append(_incident(facts, g, [h for h in faults if h["category"] == "recovered" and h["te"] == g["te"]
                                            and h["t"] >= g["t"]][:1]))  # fmt: skip
    out.sort(key=lambda x: x["t"])
    for n, inc in enumerate(out, 1):
        inc["id"] = f"incident-{n}"
    return out


def _incident(facts: Facts, head: dict[str, Any], follow: list[dict[str, Any]]) -> dict[str, Any]:
    declared = [g for g in follow if g["category"] == "declared_failed"]
    end = max([g["t"] for g in declared] + [head["t"]]) + (0.0 if declared else AFTERMATH_S)
    tes = {g["te"] for g in declared} | ({head["te"]} if head["te"] else set())
    hit = [x for x in facts.task_failures if head["t"] <= x["t"] <= end and (not tes or x["te"] in tes)]
    requests = list(dict.fromkeys(x["request_id"] for x in hit))
    return {"t": head["t"], "head": head, "follow": follow, "requests": requests, "tasks_failed": len(hit)}


def failure_groups(facts: Facts) -> list[dict[str, Any]]:
    """Failed and refused requests, grouped by reason (most first)."""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for r in facts.requests.values():
        if r["status"] != "completed":
            kind = "refused" if is_refused(r["status"], r["reason"]) else r["status"]
            groups[(kind, r["reason"][:200])].append(r["request_id"])
    return [{"kind": k, "reason": reason, "requests": ids}
            for (k, reason), ids in sorted(groups.items(), key=lambda kv: -len(kv[1]))]  # fmt: skip


def render(facts: Facts, version: str = "") -> str:
    """The whole page."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    from .report_charts import figures

    nums = summary(facts)
    incs = incidents(facts)
    groups = failure_groups(facts)
    shown = _shown_requests(incs, groups)
    charts = "".join(
        f'<section class="card chart"><div id="{key}" class="plot"></div></section>'
        f"<script>Plotly.newPlot({json.dumps(key)}, ...(function(f){{return [f.data, f.layout, "
        f"{{responsive: true, displaylogo: false}}];}})({pio.to_json(fig, validate=False)}));</script>"
        for key, fig in figures(facts).items()
    )  # fmt: skip
    body = (_header(facts, nums, version) + charts + _incident_html(facts, incs) + _failure_html(facts, groups)
            + _why_html(facts, shown))  # fmt: skip
    title = html.escape(f"deepserve report · {facts.scenario or facts.run_id}")
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{CSS}</style>"
            f"<script>{get_plotlyjs()}</script></head><body><main>{body}</main></body></html>")  # fmt: skip


def _shown_requests(incs: list[dict[str, Any]], groups: list[dict[str, Any]]) -> list[str]:
    ids: dict[str, None] = {}
    for rid in [r for i in incs for r in i["requests"][:PER_GROUP]] + [r for g in groups for r in g["requests"][:PER_GROUP]]:
        if len(ids) < MAX_WHY:
            ids[rid] = None
    return list(ids)


def _e(x: Any) -> str:
    return html.escape(str(x))


def _ms(v: float) -> str:
    return "–" if v != v else f"{v:,.0f} ms" if v >= 100 else f"{v:,.1f} ms"


def _header(facts: Facts, n: dict[str, Any], version: str) -> str:
    cards = [
        ("requests", f"{n['requests']:,}", f"{n['completed']:,} completed"),
        ("failed", f"{n['failed']:,}", f"{n['refused']:,} refused (429)", "bad" if n["failed"] else ""),
        ("SLO attainment", f"{100 * n['slo_attainment']:.1f}%", f"TTFT ≤ {facts.slo_ttft_ms:g} ms, TPOT ≤ {facts.slo_tpot_ms:g} ms",
         "good" if n["slo_attainment"] >= 0.9 else "bad"),
        ("TTFT p50 / p99", _ms(n["ttft_ms_p50"]), f"p99 {_ms(n['ttft_ms_p99'])}"),
        ("TPOT p50 / p99", _ms(n["tpot_ms_p50"]), f"p99 {_ms(n['tpot_ms_p99'])}"),
        ("end-to-end p50 / p99", _ms(n["e2e_ms_p50"]), f"p99 {_ms(n['e2e_ms_p99'])}"),
        ("throughput", f"{n['throughput_rps']:.2f} req/s", f"{n['output_tokens_per_s']:,.0f} output tokens/s"),
        ("faults · recoveries", f"{n['faults_injected']} · {n['recoveries']}", f"{len(facts.lanes)} TEs, {n['decisions']:,} routing decisions",
         "bad" if n["faults_injected"] else ""),
    ]  # fmt: skip
    tiles = "".join(
        f'<div class="tile {c[3] if len(c) > 3 else ""}"><div class="k">{_e(c[0])}</div><div class="v">{_e(c[1])}</div>'
        f'<div class="s">{_e(c[2])}</div></div>' for c in cards
    )  # fmt: skip
    sub = f"run {facts.run_id} · {facts.mode} · {n['duration_s']:,.1f} s of {'virtual' if facts.mode == 'sim' else 'wall'} time · {facts.label}"
    ver = f" · deepserve {version}" if version else ""
    return (f'<header><h1>{_e(facts.scenario or "deepserve run")}</h1><p>{_e(sub)}{_e(ver)}</p></header>'
            f'<section class="tiles">{tiles}</section>')  # fmt: skip


def _links(ids: list[str], shown: set[str] | None = None) -> str:
    if not ids:
        return '<span class="muted">none</span>'
    head = ", ".join(f'<a href="#why-{_e(r)}">{_e(r)}</a>' for r in ids[:PER_GROUP])
    more = f' <span class="muted">and {len(ids) - PER_GROUP:,} more: {_e(", ".join(ids[PER_GROUP:PER_GROUP + 30]))}{"…" if len(ids) > PER_GROUP + 30 else ""}</span>' if len(ids) > PER_GROUP else ""  # fmt: skip
    return head + more


def _incident_html(facts: Facts, incs: list[dict[str, Any]]) -> str:
    if not incs:
        return '<section class="card"><h2>Incidents</h2><p class="muted">No fault was injected and no TE was declared failed in this run.</p></section>'
    rows = []
    for inc in incs:
        h = inc["head"]
        steps = "".join(f'<li><span class="dot {g["category"]}"></span>t={g["t"]:.3f} s · {_e(g["te"])}: {_e(g["detail"])}</li>'
                        for g in inc["follow"]) or '<li class="muted">no TE declared failed after it</li>'  # fmt: skip
        rows.append(
            f'<article class="incident" id="{inc["id"]}"><h3><span class="dot {h["category"]}"></span>'
            f't={h["t"]:.3f} s · {_e(h["kind"])} → {_e(h["target"])}</h3><p class="muted">{_e(h["detail"])} (from {_e(h["source"])})</p>'
            f'<ul>{steps}</ul><p><b>{inc["tasks_failed"]}</b> task(s) failed, of <b>{len(inc["requests"])}</b> request(s): '
            f'{_links(inc["requests"])}</p></article>'
        )  # fmt: skip
    return f'<section class="card"><h2>Incidents</h2>{"".join(rows)}</section>'


def _failure_html(facts: Facts, groups: list[dict[str, Any]]) -> str:
    if not groups:
        return '<section class="card"><h2>Failures and refusals</h2><p class="muted">Every request completed.</p></section>'
    rows = "".join(f'<tr><td><span class="pill {g["kind"]}">{_e(g["kind"])}</span></td><td class="num">{len(g["requests"]):,}</td>'
                   f'<td>{_e(g["reason"])}</td><td>{_links(g["requests"])}</td></tr>' for g in groups)  # fmt: skip
    return (f'<section class="card"><h2>Failures and refusals</h2><table><thead><tr><th>kind</th><th>requests</th>'
            f'<th>reason</th><th>see why</th></tr></thead><tbody>{rows}</tbody></table></section>')  # fmt: skip


def _why_html(facts: Facts, shown: list[str]) -> str:
    if not shown:
        return ""
    parts = []
    for rid in shown:
        lines = facts.why_text(rid)
        parts.append(f'<details id="why-{_e(rid)}" class="why" open><summary>why {_e(rid)}</summary>'
                     f'<pre>{_e(chr(10).join(lines))}</pre></details>')  # fmt: skip
    return (f'<section class="card"><h2>Why: the requests named above</h2><p class="muted">What '
            f'<code>deepserve replay why LOG REQUEST_ID</code> prints for each.</p>{"".join(parts)}</section>')  # fmt: skip


CSS = """
:root{--bg:#f4f6fb;--card:#fff;--ink:#1d2433;--muted:#6b7386;--line:#e3e7ef;--accent:#3b5bdb;--bad:#d62728;--good:#2ca02c}
*{box-sizing:border-box}body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.45 Inter,'Segoe UI',Helvetica,Arial,sans-serif}
main{max-width:1280px;margin:0 auto;padding:0 20px 40px}
header{background:linear-gradient(120deg,#1b2a4e,#3b5bdb);color:#fff;margin:0 -20px 18px;padding:26px 32px;border-radius:0 0 14px 14px}
header h1{margin:0 0 4px;font-size:26px;letter-spacing:.2px}header p{margin:0;opacity:.85}
.tiles{display:grid;grid-template-columns:repeat(4,1fr);gap:12px;margin-bottom:16px}
.tile{background:var(--card);border-radius:12px;padding:14px 16px;box-shadow:0 1px 3px rgba(20,30,60,.08);border-top:4px solid var(--accent)}
.tile.bad{border-top-color:var(--bad)}.tile.good{border-top-color:var(--good)}
.tile .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.6px}.tile .v{font-size:24px;font-weight:650;margin:2px 0}
.tile .s{color:var(--muted);font-size:12px}
.card{background:var(--card);border-radius:12px;padding:16px 20px;margin-bottom:16px;box-shadow:0 1px 3px rgba(20,30,60,.08)}
.card h2{margin:0 0 10px;font-size:18px}.chart{padding:8px}.plot{width:100%}
.incident{border-left:4px solid var(--bad);padding:4px 14px;margin:10px 0}.incident h3{margin:4px 0;font-size:15px}
.incident ul{margin:6px 0;padding-left:18px;list-style:none}.incident li{margin:3px 0}
.dot{display:inline-block;width:10px;height:10px;border-radius:50%;margin-right:8px;vertical-align:middle}
.dot.injected{background:var(--bad)}.dot.declared_failed{background:#ff7f0e}.dot.recovered{background:var(--good)}
.muted{color:var(--muted)}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums}.pill{padding:1px 8px;border-radius:10px;font-size:12px;background:#fde2e2;color:#a61b1b}
.pill.refused{background:#fff1d6;color:#8a5a00}a{color:var(--accent);text-decoration:none}a:hover{text-decoration:underline}
details.why{border:1px solid var(--line);border-radius:8px;margin:8px 0}details.why summary{cursor:pointer;padding:6px 10px;font-weight:600}
details.why:target{outline:3px solid #ffd43b}pre{margin:0;padding:10px 12px;background:#0f1729;color:#dfe6f5;border-radius:0 0 8px 8px;overflow-x:auto;font-size:12px}
"""
