"""`deepserve bench policies` (a suite of cli/bench.py) and the `profile` command group
(`register_profile`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from deepserve.cmdline import CliError, positive_float, positive_int, print_json

DEFAULT_HEATMAP = "runs/heatmap-codellama-34b-tp4.json"
DEFAULT_PREDICTOR = "runs/predictor.json"
SHARED_TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
PREDICTOR_TRACES = (str(SHARED_TRACES / "azure_llm_2023_conv.csv"), str(SHARED_TRACES / "mooncake_conversation.jsonl"))


def float_list(text: str) -> tuple[float, ...]:
    if any(not x.strip() for x in text.split(",")):
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got an empty one in {text!r}")
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not values or any(not v > 0 or v != v or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"expected positive finite numbers separated by commas, got {text!r}")
    return values


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


def _ensure_heatmap(path: str, quiet: bool) -> None:
    if Path(path).is_file():
        return
    from deepserve.benchmarks.heatmap import plot_heatmap, profile_heatmap

    if not quiet:
        print(f"no heatmap at {path}: profiling the default grid first ...", file=sys.stderr, flush=True)
    data = profile_heatmap()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
    plot_heatmap(data, str(Path(path).with_suffix(".png")))


def _ensure_predictor(path: str, quiet: bool) -> None:
    if Path(path).is_file():
        return
    if path != DEFAULT_PREDICTOR:
        raise CliError(f"--predictor: no file {path}")
    from deepserve.benchmarks.predictor import train

    if not quiet:
        print(f"no predictor at {path}: training it on {', '.join(PREDICTOR_TRACES)} ...", file=sys.stderr, flush=True)
    data = train(PREDICTOR_TRACES)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")


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
            _ensure_heatmap(args.heatmap, args.json)
            _ensure_predictor(args.predictor, args.json)
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


def register_profile(subparsers: argparse._SubParsersAction) -> None:
    prof = subparsers.add_parser("profile", help="offline profiles the schedulers load (PD heatmap)")
    which = prof.add_subparsers(dest="profile_command", metavar="WHAT", required=True)
    h = which.add_parser("heatmap", help="DeepServe Fig. 6: JCT colocated vs PD over prefill x ratio x RPS")
    h.add_argument("--model", default="codellama-34b", help="model (default codellama-34b)")
    h.add_argument("--tp", type=positive_int, default=4, help="tensor parallelism of each TE (default 4)")
    h.add_argument("--prefill", type=float_list, metavar="A,B", help="prefill lengths (default 128,512,1024,2048,4096)")
    h.add_argument("--ratio", type=float_list, metavar="A,B", help="decode/prefill ratios (default 1/32 .. 1)")
    h.add_argument("--rps", type=float_list, metavar="A,B", help="request rates (default 0.5,1,2)")
    h.add_argument("--requests", type=positive_int, default=32, help="identical requests per cell (default 32)")
    h.add_argument("--out", default=DEFAULT_HEATMAP, help=f"data file (default {DEFAULT_HEATMAP}); PNG beside it")
    h.add_argument("--json", action="store_true", help="print the data file's content")
    h.set_defaults(func=_run_heatmap)
    pr = which.add_parser("predictor", help="DeepServe 5.3.3: decode-length bucket classifier trained on traces")
    pr.add_argument("--trace", action="append", default=[], metavar="PATH",
                    help="training traces (repeatable; default the shared Azure and Mooncake conversation traces)")
    pr.add_argument("--max-depth", type=positive_int, default=8, help="decision-tree depth (default 8)")
    pr.add_argument("--out", default=DEFAULT_PREDICTOR, help=f"model file (default {DEFAULT_PREDICTOR})")
    pr.add_argument("--json", action="store_true", help="print the report as JSON")
    pr.set_defaults(func=_run_predictor)


def _run_predictor(args: argparse.Namespace) -> int:
    from deepserve.adapters.traces import TraceError, open_trace
    from deepserve.benchmarks.predictor import train

    traces = tuple(args.trace) or PREDICTOR_TRACES
    try:
        for t in traces:
            open_trace(t)
        data = train(traces, args.max_depth)
    except (TraceError, ValueError) as exc:
        raise CliError(str(exc)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    report = {k: v for k, v in data.items() if k != "predictor"}
    if args.json:
        print_json(report)
        return 0
    print(f"decode-length predictor: 128-token buckets, decision tree depth {args.max_depth}, "
          f"trained on {data['train_requests']} requests (first 80% of each trace)")
    print(f"{'trace':<60} {'held out':>8} {'accuracy':>9} {'majority':>9}")
    for r in data["per_trace"]:
        print(f"{Path(r['trace']).name:<60} {r['held_out']:>8} {r['accuracy']:>9.3f} {r['majority_baseline']:>9.3f}")
    print(f"{'all':<60} {'':>8} {data['accuracy_held_out']:>9.3f} {data['majority_baseline']:>9.3f}")
    print(f"model: {out}")
    return 0


def _run_heatmap(args: argparse.Namespace) -> int:
    from deepserve.adapters.hardware.models import known_models
    from deepserve.benchmarks.heatmap import (
        PREFILL_EDGES,
        RATIO_EDGES,
        RPS,
        plot_heatmap,
        profile_heatmap,
    )

    if args.model not in known_models():
        raise CliError(f"--model: unknown model {args.model!r}; known: {', '.join(known_models())}")
    prefill = tuple(int(p) for p in args.prefill) if args.prefill else PREFILL_EDGES
    if any(p < 1 for p in prefill):
        raise CliError("--prefill: lengths must be >= 1 token")
    try:
        data = profile_heatmap(args.model, args.tp, tuple(sorted(prefill)), tuple(sorted(args.ratio or RATIO_EDGES)),
                               args.rps or RPS, args.requests,
                               progress=None if args.json else lambda s: print(f"measuring {s} ...", file=sys.stderr, flush=True))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1), encoding="utf-8")
    png = out.with_suffix(".png")
    plot_heatmap(data, str(png))
    if args.json:
        print_json(data)
    else:
        h = data["heatmap"]
        print(f"heatmap {args.model} TP={args.tp}: JCT(colocated)/JCT(PD) - 1 summed over RPS "
              f"{', '.join(f'{r:g}' for r in h['rps'])} (> 0: PD faster)")
        print("prefill \\ ratio " + "".join(f"{r:>9g}" for r in h["ratio_edges"]))
        for p, row in zip(h["prefill_edges"], h["values"], strict=True):
            print(f"{p:>15} " + "".join(f"{v:>+9.3f}" for v in row))
        print(f"data: {out}\nplot: {png}")
    return 0
