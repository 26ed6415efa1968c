"""`deepserve bench routing` (a suite of cli/bench.py): the cost of one JE routing decision
against one walk of the prompt tree, measured in the same run (benchmarks/routing.py)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from deepserve.cli.profile import (
    DEFAULT_HEATMAP,
    DEFAULT_PREDICTOR,
    ensure_heatmap,
    ensure_predictor,
)
from deepserve.cmdline import CliError, positive_int

MAX_TES = 4096
MAX_SAMPLES = 1_000_000
MAX_PROMPT_TOKENS = 32_768  # the tree holds 2,000 such prompts: 512 blocks each at most
BLOCK_TOKENS = 128


def _bounded(limit: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = positive_int(text)
        if value > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,}, got {text}")
        return value

    return parse


def register(which: argparse._SubParsersAction) -> None:
    from deepserve.actors.scheduling import POLICIES

    p = which.add_parser("routing", help="one JE routing decision vs one walk of the prompt tree (same run)")
    p.add_argument("--policy", choices=POLICIES, default="combined",
                   help="the policy deciding (default combined: the heatmap and the predictor too)")
    p.add_argument("--tes", type=_bounded(MAX_TES), default=64, help="TEs of the model's group (default 64)")
    p.add_argument("--prompt-tokens", type=_bounded(MAX_PROMPT_TOKENS), default=2048,
                   help=f"prompt length, {BLOCK_TOKENS} to {MAX_PROMPT_TOKENS:,} (default 2048)")
    p.add_argument("--samples", type=_bounded(MAX_SAMPLES), default=2000, help="samples a round (default 2000)")
    p.add_argument("--rounds", type=_bounded(20), default=5, help="rounds, the best kept per row (default 5)")
    p.add_argument("--heatmap", metavar="FILE", default=DEFAULT_HEATMAP,
                   help=f"PD heatmap (default {DEFAULT_HEATMAP}; profiled if missing)")
    p.add_argument("--predictor", metavar="FILE", default=DEFAULT_PREDICTOR,
                   help=f"decode-length predictor (default {DEFAULT_PREDICTOR}; trained if missing)")
    p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    p.set_defaults(func=_run_routing)


def _run_routing(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.sched import load_heatmap, load_predictor
    from deepserve.adapters.traces import TraceError
    from deepserve.benchmarks.routing import routing_bench
    from deepserve.benchmarks.table import as_json_lines, render

    if args.prompt_tokens < BLOCK_TOKENS:
        raise CliError(f"--prompt-tokens: at least one {BLOCK_TOKENS}-token block, got {args.prompt_tokens}")
    if args.tes < 4:
        raise CliError(f"--tes: at least 4 (colocated, prefill and decode TEs), got {args.tes}")
    for flag, path, default in (("--heatmap", args.heatmap, DEFAULT_HEATMAP),
                                ("--predictor", args.predictor, DEFAULT_PREDICTOR)):  # fmt: skip
        if path != default:
            from pathlib import Path

            if not Path(path).is_file():
                raise CliError(f"{flag}: no file {path}")
    pd = args.policy in ("pd_aware", "combined")
    try:
        if pd:
            ensure_heatmap(args.heatmap, args.json)
        ensure_predictor(args.predictor, args.json)
        config = {"policy": args.policy, "heatmap": load_heatmap(args.heatmap) if pd else None,
                  "predictor": load_predictor(args.predictor)}
    except (ValueError, TraceError) as exc:  # a training trace that cannot be read, a bad file
        raise CliError(str(exc)) from None

    def progress(label: str) -> None:
        if not args.json:
            print(f"measuring {label} ...", file=sys.stderr, flush=True)

    title, rows = routing_bench(config, args.tes, args.prompt_tokens, args.samples, args.rounds, progress)
    print(as_json_lines(rows) if args.json else render(title, rows))
    return 0
