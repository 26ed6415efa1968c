"""`deepserve bench policies` (a suite of cli/bench.py); the bench is benchmarks/policies.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from deepserve.cli.profile import (
    DEFAULT_HEATMAP,
    DEFAULT_PREDICTOR,
    ensure_heatmap,
    ensure_predictor,
    float_list,
)
from deepserve.cmdline import CliError, positive_float, positive_int, print_json


def name_list(text: str) -> tuple[str, ...]:
    from deepserve.actors.scheduling import POLICIES

    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in POLICIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"unknown policy {bad[0] if bad else text!r}; known: {', '.join(POLICIES)}")
    return names


def mode_list(text: str) -> tuple[str, ...]:
    modes = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [m for m in modes if m not in ("on_demand", "local_queue")]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"unknown mode {bad[0] if bad else text!r}; known: on_demand, local_queue")
    return modes


def register(which: argparse._SubParsersAction) -> None:
    p = which.add_parser("policies", help="issue-6 scheduling policies: JCT/TTFT/TPOT, SLO, hit rate vs RPS")
    p.add_argument("--trace", action="append", default=[], metavar="PATH",
                   help="Mooncake JSONL or Azure CSV (repeatable; default: the built-in Azure and Mooncake slices)")
    p.add_argument("--rps", type=float_list, metavar="A,B,C", help="request rates (default: 0.5,1,2,4)")
    p.add_argument("--policies", type=name_list, metavar="A,B", help="policies (default: all)")
    p.add_argument("--cluster", action="append", default=[], metavar="NAME|FILE",
                   help="fig7, large, or a TOML file of cluster fields (repeatable; default: fig7 and large)")
    p.add_argument("--forwarding", type=mode_list, metavar="A,B",
                   help="also compare P/D-Serve forwarding: on_demand (prefill refuses, JE re-offers until the "
                        "TTFT SLO) and/or local_queue; rows read policy/mode (default: prefill queues locally)")
    p.add_argument("--requests", type=positive_int, default=200, metavar="N", help="requests per run (default 200)")
    p.add_argument("--heatmap", metavar="FILE", default=DEFAULT_HEATMAP,
                   help=f"PD heatmap for pd_aware/combined (default {DEFAULT_HEATMAP}; made if missing)")
    p.add_argument("--predictor", metavar="FILE", default=DEFAULT_PREDICTOR,
                   help=f"decode-length predictor for pd_aware/combined (default {DEFAULT_PREDICTOR}; trained if missing)")
    p.add_argument("--slo-ttft-ms", type=positive_float, default=2000.0, help="TTFT SLO (default 2000)")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=100.0, help="TPOT SLO (default 100)")
    p.add_argument("--png", metavar="PATH", default="runs/policies.png", help="JCT vs RPS plot (default runs/policies.png)")
    p.add_argument("--json", action="store_true", help="one JSON object per (policy, trace, cluster, rps)")
    p.set_defaults(func=_run_policies)


def _run_policies(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.loader import ScenarioError, trace_path
    from deepserve.adapters.traces import TraceError, open_trace
    from deepserve.benchmarks.policies import (
        DEFAULT_POLICIES,
        DEFAULT_TRACES,
        ROW_FIELDS,
        Slo,
        load_cluster,
        native_rps,
        plot,
        render_table,
        run_cell,
    )

    policies = args.policies or DEFAULT_POLICIES
    traces = tuple(args.trace) or DEFAULT_TRACES
    rps = args.rps or (0.5, 1.0, 2.0, 4.0)
    try:
        clusters = [load_cluster(c) for c in (args.cluster or ["fig7", "large"])]
        for t in args.trace:
            open_trace(trace_path(t))
        for t in traces:  # each run scales the trace's own rate: it needs one over --requests
            try:
                native_rps(t, args.requests)
            except ValueError:
                raise CliError(f"--requests {args.requests}: the first {args.requests} requests of {t} arrive "
                               "at one time; each run scales the trace's own rate, so it needs more") from None
        if {"pd_aware", "combined"} & set(policies):
            if args.heatmap != DEFAULT_HEATMAP and not Path(args.heatmap).is_file():
                raise CliError(f"--heatmap: no file {args.heatmap}")
            ensure_heatmap(args.heatmap, args.json)
            ensure_predictor(args.predictor, args.json)
    except (ValueError, TraceError, ScenarioError) as exc:
        raise CliError(str(exc)) from None
    slo = Slo(args.slo_ttft_ms, args.slo_tpot_ms)
    rows: list[dict[str, Any]] = []
    try:
        for c in clusters:
            for trace in traces:
                for r in rps:
                    for policy in policies:
                        for mode in args.forwarding or ("",):
                            if not args.json:
                                print(f"measuring {policy}{'/' + mode if mode else ''} on {c.name} / {trace} "
                                      f"at {r:g} rps ...", file=sys.stderr, flush=True)
                            rows.append(run_cell(policy, trace, c, r, args.requests, slo, args.heatmap,
                                                 args.predictor, forwarding=mode))
    except (ValueError, TraceError, ScenarioError) as exc:
        raise CliError(str(exc)) from None
    if args.json:
        for row in rows:
            print_json({k: row[k] for k in ROW_FIELDS})
    else:
        print(f"bench policies: {args.requests} requests per run; SLO TTFT <= {slo.ttft_ms:g} ms and "
              f"TPOT <= {slo.tpot_ms:g} ms; emulated NPUs (virtual time)")
        for c in clusters:
            print(render_table(rows, c.name))
    if args.png:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        plot(rows, args.png)
        if not args.json:
            print(f"plot: {args.png}")
    return 0
