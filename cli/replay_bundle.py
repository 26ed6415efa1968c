"""`deepserve replay bundle LOG_OR_RUN_DIR -o incident.tar.gz`, and opening a bundle where a log goes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from deepserve.cmdline import CliError, print_json


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bundle", help="pack a log or run directory, its resolved config and code version into one file",
        description="Pack a run's log(s), its resolved config (secrets removed), the code version and a "
        "README into one gzipped tar that every `deepserve replay` command opens as it is.",
    )  # fmt: skip
    p.add_argument("log", metavar="LOG_OR_RUN_DIR", help="a SQLite log file or a run directory")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the bundle to write, e.g. incident.tar.gz")
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p.set_defaults(func=_bundle)


def _bundle(args: argparse.Namespace) -> int:
    from deepserve.replay.bundle import make_bundle

    if "://" in args.log:
        raise CliError(f"{args.log}: a bundle packs SQLite logs (a file or a run directory), not a database URL")
    out = Path(args.output)
    if out.exists() and out.is_dir():
        raise CliError(f"-o {out}: is a directory; name the bundle file")
    manifest = make_bundle(Path(args.log), out)
    if args.json:
        import msgspec

        print_json(msgspec.to_builtins(manifest))
    else:
        runs = ", ".join(r["run_id"] for r in manifest.runs)
        print(f"{out}: {len(manifest.logs)} log(s), runs {runs}, code {manifest.code_version}")
    return 0


def resolve_log(target: str) -> str:
    """The path to read for a LOG argument: a bundle is unpacked (privately, removed at exit) and its
    log or logs directory returned; anything else is returned as it is. A bundle made by other
    code gets one line of note on stderr."""
    from deepserve.replay.bundle import is_bundle, open_bundle

    if "://" in target or not is_bundle(target):
        return target
    path, _manifest, note = open_bundle(target)
    if note:
        print(note, file=sys.stderr)
    return path
