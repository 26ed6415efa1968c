"""`deepserve hw ...`: the emulated hardware's predictions, from the command line.

    deepserve hw predict --model llama3-70b --npu 910b --tp 8 [--mtp 0.9] [--pd-link roce] [--json]

prints predicted prefill and decode latency over a grid of batch sizes and context lengths, the
KV capacity in tokens, and the load time by path (SSD, DRAM hit, NPU-fork over the scale-up and
scale-out links); with --mtp, MTP decode; with --pd-link, the TTFT of a PD pair. Layouts the
cluster cannot hold exit 2 naming the limit. The numbers are predict.py's; this module only
parses and prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import msgspec

from deepserve.adapters.hardware.models import known_models
from deepserve.adapters.hardware.predict import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_CONTEXT_TOKENS,
    PD_LINKS,
    predict,
    render,
)
from deepserve.adapters.hardware.specs import CLUSTERS, NPUS

EXIT_BAD_INPUT = 2


def _int_list(text: str) -> tuple[int, ...]:
    """argparse type for "1,8,32"."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def register(subparsers: Any) -> None:
    """Add the `hw` command group to the `deepserve` command's subparsers."""
    hw = subparsers.add_parser("hw", help="the emulated hardware's performance model")
    sub = hw.add_subparsers(dest="hw_command", required=True, metavar="HW_COMMAND")
    p = sub.add_parser(
        "predict",
        help="predicted latency, KV capacity and load times for a model and layout",
        description="Predicted prefill/decode latency over batch sizes and context lengths, KV "
        "capacity in tokens, and load times by path, from the documented performance model.",
    )
    p.add_argument("--model", required=True, help=f"model profile: {', '.join(known_models())}")
    p.add_argument("--npu", required=True, choices=sorted(NPUS), help="NPU kind")
    p.add_argument("--tp", required=True, type=int, help="tensor-parallel degree (NPUs per TE)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel groups (default 1)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel ranks for MoE models: 1 or dp x tp (default 1)")
    p.add_argument("--shared-expert-ranks", type=int, default=0, metavar="N",
                   help="EP ranks serving only the shared expert (xDeepServe §7.1: 32)")
    p.add_argument("--redundant-experts", type=int, default=0, metavar="N",
                   help="extra routed-expert replicas for load balance (EPLB; §7.1: 256)")
    p.add_argument(
        "--batch-sizes", type=_int_list, default=DEFAULT_BATCH_SIZES, metavar="N,N,...",
        help=f"batch sizes of the grid (default: {','.join(map(str, DEFAULT_BATCH_SIZES))})",
    )  # fmt: skip
    p.add_argument(
        "--contexts", type=_int_list, default=DEFAULT_CONTEXT_TOKENS, metavar="N,N,...",
        help=f"context lengths of the grid (default: {','.join(map(str, DEFAULT_CONTEXT_TOKENS))})",
    )  # fmt: skip
    p.add_argument("--cluster", choices=sorted(CLUSTERS), default=None,
                   help="cluster the layout must fit (default: gen1 for 910b, cm384 for 910c)")
    p.add_argument("--servers", type=int, default=None, metavar="N",
                   help="servers in the cluster (default: the cluster's; gen1 8, cm384 48)")
    p.add_argument("--mtp", type=float, default=None, metavar="ACCEPTANCE",
                   help="add MTP decode with one draft accepted at this rate (xDeepServe §4.6)")
    p.add_argument("--pd-link", choices=PD_LINKS, default=None,
                   help="add the TTFT of a PD pair whose KV moves over this link")
    p.add_argument("--fork-targets", type=int, default=1, metavar="N",
                   help="new TEs forked at once (an HCCL broadcast) in the npu-fork rows")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    try:
        prediction = predict(
            args.model,
            args.npu,
            args.tp,
            dp=args.dp,
            ep=args.ep,
            shared_expert_ranks=args.shared_expert_ranks,
            redundant_experts=args.redundant_experts,
            batch_sizes=args.batch_sizes,
            context_tokens=args.contexts,
            cluster=args.cluster,
            servers=args.servers,
            mtp_acceptance=args.mtp,
            pd_link=args.pd_link,
            fork_targets=args.fork_targets,
        )
    except (ValueError, KeyError) as exc:
        message = " ".join(str(exc.args[0] if exc.args else exc).split())
        print(f"deepserve: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT) from None
    if args.json:
        sys.stdout.write(msgspec.json.encode(prediction).decode() + "\n")
    else:
        sys.stdout.write(render(prediction))
    return 0
