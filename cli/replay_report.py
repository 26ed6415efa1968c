"""`deepserve replay report LOG -o report.html` and `deepserve replay export LOG --format F -o OUT`."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from deepserve.cli.replay import _command, _read
from deepserve.cli.util import CliError

# Each command's help, for `replay --help`
REPORT_HELP = "one self-contained HTML page: cluster timeline, latencies, SLO, incidents with their why"
EXPORT_HELP = "the run as Perfetto trace events, or one row per request, decision and fault (csv, parquet, SQL views)"


def register(sub: Any) -> None:
    p = _command(sub, "report", _report, REPORT_HELP)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write (replaced if it exists)")
    p.epilog = "the page needs no network: plotly.js is inside it"

    from deepserve.replay.export import FORMATS

    p = _command(sub, "export", _export, EXPORT_HELP)
    p.add_argument("--format", required=True, choices=FORMATS, help="perfetto: Chrome trace-event JSON (a file); "
                   "csv, parquet: a directory of requests, decisions, faults; sql: tables and views in the log itself")  # fmt: skip
    p.add_argument("-o", "--output", metavar="OUT", help="perfetto: the JSON file; csv, parquet: a directory "
                   "(created if needed); sql: not used (the views go into LOG)")  # fmt: skip
    opening = p.get_default("func")  # LOG as given, before a bundle is unpacked (sql writes into LOG)

    def export(args: argparse.Namespace) -> int:
        args.log_given = args.log
        return int(opening(args))

    p.set_defaults(func=export)


def _collect(args: argparse.Namespace) -> Any:
    from deepserve.replay.report_facts import collect

    reader = _read(args)
    try:
        return collect(reader, args.run)
    finally:
        reader.close()


def _output_file(path: str, what: str) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise CliError(f"-o {path}: directory {parent} does not exist (the {what} goes into an existing directory)")
    if os.path.isdir(path):
        raise CliError(f"-o {path}: is a directory; give the {what}'s file name")
    return path


def _report(args: argparse.Namespace) -> int:
    from deepserve.core.driver import CODE_VERSION
    from deepserve.replay.report import render, summary

    out = _output_file(args.output, "report")
    facts = _collect(args)
    page = render(facts, CODE_VERSION)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(page)
    nums = summary(facts)
    if args.json:
        print(json.dumps({"report": out, "bytes": len(page.encode()), **nums}))
    else:
        print(f"{out}: {nums['requests']:,} requests, {nums['faults_injected']} faults, "
              f"{len(facts.lanes)} TEs ({len(page.encode()) / 1e6:.1f} MB, opens with no network)")  # fmt: skip
    return 0


def _export(args: argparse.Namespace) -> int:
    from deepserve.replay import export

    fmt = args.format
    if fmt == "sql":
        return _export_sql(args)
    if not args.output:
        raise CliError(f"--format {fmt}: -o is required ({'a JSON file' if fmt == 'perfetto' else 'a directory'})")
    if fmt == "perfetto":
        out = _output_file(args.output, "trace")
        trace = export.perfetto(_collect(args))
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(trace, fh, separators=(",", ":"))
        _done(args, [out], f"{len(trace['traceEvents']):,} trace events (open in ui.perfetto.dev or chrome://tracing)")
        return 0
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise CliError(f"-o {args.output}: is a file; --format {fmt} writes a directory of requests, decisions, faults")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise CliError("--format parquet needs the pyarrow package, not installed: "
                           "pip install 'deepserve[parquet]'") from None  # fmt: skip
    facts = _collect(args)
    os.makedirs(args.output, exist_ok=True)
    written = export.write_csv(facts, args.output) if fmt == "csv" else export.write_parquet(facts, args.output)
    _done(args, written, f"{len(facts.requests):,} requests, {len(facts.decisions):,} decisions, {len(facts.faults):,} faults")
    return 0


def _export_sql(args: argparse.Namespace) -> int:
    from deepserve.persistence.views import VIEWS, write_views
    from deepserve.replay import export

    if args.output:
        raise CliError("--format sql writes its views into LOG itself: drop -o")
    if args.log != args.log_given:
        raise CliError(f"{args.log_given}: an incident bundle is not a log to write into: --format sql needs a "
                       "SQLite log file (export csv or parquet from a bundle)")  # fmt: skip
    if not os.path.isfile(args.log):
        raise CliError(f"{args.log}: --format sql writes into one SQLite log file (of a run directory: "
                       "one of its .db files)")  # fmt: skip
    facts = _collect(args)
    write_views(args.log, facts.run_id, export.COLUMNS, export.tables(facts))
    _done(args, [args.log], f"views {', '.join(VIEWS)} for run {facts.run_id}")
    return 0


def _done(args: argparse.Namespace, written: list[str], what: str) -> None:
    if args.json:
        print(json.dumps({"written": written, "format": args.format}))
    else:
        print(f"{', '.join(written)}: {what}")
