"""`deepserve replay whatif LOG_OR_RUN_DIR [--config NEW.toml] [--set K=V]... [--at-decision ID
--choose TE] [--log PATH] [--json]`: a recorded run's external inputs re-simulated on the whole
cluster in virtual time under a changed config (or one routing decision forced elsewhere), beside
the original (deepserve/cluster/whatif.py). Bad input — the log, a `--set`, a decision id — is
exit 2 with one line."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from deepserve.cli.util import CliParser, require_driver
from deepserve.cmdline import CliError, print_json, seconds

ROWS = (
    ("requests", "requests"), ("completed", "completed"), ("failed", "failed"), ("cancelled", "cancelled"),
    ("TTFT ms p50", "ttft_ms_p50"), ("TTFT ms p99", "ttft_ms_p99"), ("TPOT ms p50", "tpot_ms_p50"),
    ("TPOT ms p99", "tpot_ms_p99"), ("e2e ms p50", "e2e_ms_p50"), ("e2e ms p99", "e2e_ms_p99"),
    ("SLO attainment", "slo_attainment"), ("prefix hit rate", "prefix_hit_rate"),
    ("recoveries", "recoveries"), ("TEs ready at end", "tes_ready_at_end"), ("faults injected", "faults_injected"),
    ("scaling actions", "scaling_actions"), ("virtual time s", "virtual_time_s"), ("deliveries", "deliveries"),
)  # fmt: skip


def register(sub: Any) -> None:
    p: CliParser = sub.add_parser(
        "whatif", help="re-simulate a recorded run under another config or routing choice, side by side",
        description="Re-simulate a recorded run's external inputs (requests, faults, admin actions) on the "
                    "whole cluster in virtual time under a changed config, beside the original.")  # fmt: skip
    p.add_argument("log", metavar="LOG_OR_RUN_DIR", help="a simulation's log, a daemon's run directory or an incident bundle")
    p.add_argument("--run", metavar="RUN_ID", help="which run of the log (default: the last)")
    p.add_argument("--config", metavar="NEW.toml", help="a config file to run instead of the recorded one")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="change a config key, e.g. scheduling.policy=least_load (repeatable)")
    p.add_argument("--from", dest="from_s", type=seconds, metavar="T",
                   help="fork at time T: the cluster restored from the log at T (the part before T not re-run), "
                        "the change applied from T")
    p.add_argument("--at-decision", metavar="ID", help="a routing decision's id (`replay why` shows it: a task id)")
    p.add_argument("--choose", metavar="TE", help="with --at-decision: the TE that decision chooses instead")
    p.add_argument("--log", dest="out_log", metavar="PATH", help="write the what-if's own log here (a new file)")
    p.add_argument("--json", action="store_true", help='print {"original", "whatif", "first_difference"}')
    p.set_defaults(func=_whatif)


def _whatif(args: argparse.Namespace) -> int:
    from deepserve.adapters.scenario.loader import ScenarioError
    from deepserve.cli.sim_scenario import report
    from deepserve.cluster.whatif import config_of, routing_decision, whatif
    from deepserve.replay.inputs import open_run

    if (args.at_decision is None) != (args.choose is None):
        raise CliError("--at-decision and --choose go together: the decision's id and the TE it chooses instead")
    if args.from_s is not None and args.at_decision is not None:
        raise CliError("--from and --at-decision: a forced decision is a fork at that decision already; give one")
    if args.from_s is not None and args.out_log:
        raise CliError("--from and --log: a forked run's log would not replay (its actors change config at T)")
    from deepserve.cli.replay_bundle import resolve_log

    args.log = resolve_log(args.log)  # an incident bundle (replay bundle) is unpacked first
    require_driver(args.log)
    from deepserve.replay.fork import Cut

    inputs = open_run(args.log, args.run, args.from_s, cut=Cut(args.from_s) if args.from_s is not None else None)
    if args.from_s is not None and not 0 < args.from_s < inputs.end_t:
        raise CliError(f"--from {args.from_s:g}: the run goes from 0 to {inputs.end_t:g} s; fork inside it")
    try:
        cfg = config_of(inputs, args.config, args.overrides)
    except ScenarioError as exc:
        raise CliError(str(exc)) from None
    forced = routing_decision(inputs, args.at_decision, args.choose) if args.at_decision else None
    changes = [f"--set {o}" for o in args.overrides] + ([f"--config {args.config}"] if args.config else [])
    changes += [f"--at-decision {args.at_decision} --choose {args.choose}"] if forced else []
    sink = _sink(args.out_log) if args.out_log else None
    try:
        result = whatif(inputs, cfg, inputs.manager, changes=changes, sink=sink, forced=forced, from_s=args.from_s)
    finally:
        if sink is not None:
            sink.close()
    if inputs.mode != "sim":  # a daemon incident: how far its virtual re-run agrees (issue 32 §1)
        from deepserve.cluster.whatif import agreement

        result.agreement = agreement(inputs, config_of(inputs, None, []), result if not changes else None)
    trace = str(inputs.config.get("workload", {}).get("trace", ""))
    name, seed = str(inputs.config.get("name", "")), cfg.seed
    before = report(name, seed, trace, result.original, 0.0, inputs.path)
    after = report(name, seed, trace, result.whatif, result.whatif.wall_s, args.out_log or "none")
    diff = None if result.first_difference is None else _builtins(result.first_difference)
    if args.json:
        agreed = None if result.agreement is None else _builtins(result.agreement)
        if agreed is not None and agreed["rerun"] is not None:
            agreed["rerun"] = report(name, seed, trace, result.agreement.rerun, 0.0, "none")  # type: ignore[union-attr]
        print_json({"original": before, "whatif": after, "first_difference": diff, "changes": result.changes,
                    "mode": inputs.mode, "request": result.request, "agreement": agreed})  # fmt: skip
        return 0
    _print(inputs, before, after, diff, result.changes)
    if result.agreement is not None:
        a = result.agreement
        print(f"the wall-clock run against its virtual re-run with no change: {a.same_te} of {a.routing_decisions} "
              f"routing decisions chose the same TE, {a.same_end} of {a.requests} requests ended the same way")
    if result.request is not None:
        _print_request(result.request)
    return 0


def _print_request(r: dict[str, Any]) -> None:
    print(f"request {r['request_id']}:")
    for side in ("original", "whatif"):
        o = r[side]
        if o is None:
            print(f"  {side:>8}: not terminal")
            continue
        ttft = f"TTFT {o['ttft_ms']:.1f} ms, " if o["ttft_ms"] is not None else ""
        print(f"  {side:>8}: {o['status']} ({o['reason']}) on {o['te'] or '-'}, {ttft}e2e {o['e2e_ms']:.1f} ms, "
              f"{o['cached_prompt_tokens']} prompt tokens cached")


def _builtins(x: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(x)


def _sink(path: str) -> Any:
    import os

    from deepserve.persistence import open_sink

    if os.path.exists(path):
        raise CliError(f"--log {path}: exists; a what-if writes a new log")
    return open_sink(path, "async", writer="process")


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "none" if math.isnan(v) else f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _print(inputs: Any, before: dict[str, Any], after: dict[str, Any], diff: Any, changes: list[str]) -> None:
    kind = "simulation" if inputs.mode == "sim" else "daemon run (wall clock; the what-if runs in virtual time)"
    print(f"what-if of {inputs.path} (run {inputs.run_id}, a {kind}): {'; '.join(changes) or 'no change'}")
    width = max(len(label) for label, _ in ROWS)
    print(f"  {'':>{width}}  {'original':>12}  {'what-if':>12}")
    for label, key in ROWS:
        a, b = before.get(key, "-"), after.get(key, "-")
        mark = "" if _cell(a) == _cell(b) else "  *"
        print(f"  {label:>{width}}  {_cell(a):>12}  {_cell(b):>12}{mark}")
    reasons = sorted(set(before["failure_reasons"]) | set(after["failure_reasons"]))
    for r in reasons:
        a, b = before["failure_reasons"].get(r, 0), after["failure_reasons"].get(r, 0)
        print(f"  failed: {r}: {a} -> {b}")
    for a, b in zip(before.get("faults", ()), after.get("faults", ()), strict=False):
        print(f"  fault {a['kind']} {a['target']} at {a['at_s']:g} s: " + ", ".join(
            f"{k.replace('_', ' ')} {_cell(a.get(k))} -> {_cell(b.get(k))}"
            for k in ("detected_after_s", "recovered_after_s", "failed", "retried")))
    if diff is None:
        print("first difference: none (every decision the same)")
    else:
        print(f"first difference: t={diff['t']:.6f} {diff['actor']} on {diff['about']}: original {diff['original']}, "
              f"what-if {diff['whatif']}")  # fmt: skip
    sys.stdout.flush()
