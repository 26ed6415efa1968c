"""`deepserve profile heatmap | predictor`: the offline profiles the schedulers load (the PD
heatmap, the decode-length predictor), made by benchmarks/heatmap.py and benchmarks/predictor.py;
`bench policies` and `bench routing` make the default ones when missing."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from deepserve.cmdline import CliError, positive_int, print_json

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


def ensure_heatmap(path: str, quiet: bool) -> None:
    if Path(path).is_file():
        return
    from deepserve.benchmarks.heatmap import plot_heatmap, profile_heatmap

    if not quiet:
        print(f"no heatmap at {path}: profiling the default grid first ...", file=sys.stderr, flush=True)
    data = profile_heatmap()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
    plot_heatmap(data, str(Path(path).with_suffix(".png")))


def ensure_predictor(path: str, quiet: bool) -> None:
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


def register(subparsers: argparse._SubParsersAction) -> None:
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
