"""`deepserve replay verify|state|log|digest|migrate LOG ...`"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

import msgspec

from deepserve.cli.usercode import add_user_code_arguments, load_user_code
from deepserve.cli.util import CliParser, require_driver
from deepserve.cmdline import CliError, print_json, print_pretty_json, seconds
from deepserve.replay.common import compact

if TYPE_CHECKING:
    from deepserve.persistence import LogReader
    from deepserve.persistence.api import EndState
    from deepserve.replay.verifier import Divergence

# The log machinery (SQLAlchemy, the readers, re-execution) is imported by the commands that
# use it, not when the parser is built: `deepserve --help` and the other command groups do
# not pay ~0.4 s for it.

EXIT_DIVERGED = 1
# Identical as far as the log goes, but the log has no closing record (its process died, or
# still writes): not "identical", which a script would take for the whole run.
EXIT_UNCLOSED = 3


def register(subparsers: Any) -> None:
    parser: CliParser = subparsers.add_parser(
        "replay",
        help="verify, inspect and compare a recorded log",
        description="Re-execute a recorded run, inspect actors' state and the log.",
    )
    sub = parser.add_subparsers(dest="replay_command", required=True, metavar="COMMAND")

    p = _command(sub, "verify", _verify, "re-execute every actor from its logged inputs")
    p.epilog = ("a run directory with one log per process (deepserve up --processes) is verified log by log; "
                "exit status: 0 identical, 1 diverged, 2 the log cannot be read or replayed (damaged, or cut "
                "after its end was written), 3 identical as far as the log goes, but it has no closing "
                "record (its process died, or still runs)")

    p = _command(sub, "state", _state, "an actor's state (or the whole cluster's) at a clock time, folded from its events")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--actor", metavar="A", help="actor address, e.g. worker/1")
    which.add_argument("--cluster", action="store_true", help="every TE (role, generation, state, DP queues, "
                       "running batch, KV usage) and every JE (open jobs) in one table")
    p.add_argument("--at", type=seconds, metavar="T", help="clock time in seconds (default: end)")

    p = _command(sub, "log", _log, "list inputs with their events and outputs")
    p.add_argument("--actor", metavar="A", help="only inputs delivered to this actor")
    p.add_argument("--corr", metavar="ID", help="only inputs with this correlation id")
    p.add_argument("--since", type=seconds, metavar="T", help="only inputs at or after T")
    p.add_argument("--until", type=seconds, metavar="T", help="only inputs at or before T")

    _command(sub, "digest", _digest, "content digest, comparable between runs")

    p = _command(sub, "why", _why, "a request's path (gateway, JE, TEs) and what decided each hop")
    p.add_argument("request_id", metavar="REQUEST_ID", help="the request's id: a daemon's chat-N or cmpl-N (its X-Request-Id), a simulation's rN")

    __import__("deepserve.cli.replay_whatif", fromlist=["register"]).register(sub)

    p = _command(
        sub, "migrate", _migrate, "upgrade a log written by an older schema, in place", reads=False
    )
    p.epilog = "every *.db file of a run directory is migrated; running it again changes nothing"

    from deepserve.cli import replay_bundle

    replay_bundle.register(sub)

    from deepserve.cli import replay_report  # report, export (its own module: cli/replay_report.py)

    replay_report.register(sub)


def _command(sub: Any, name: str, func: Any, help_text: str, *, reads: bool = True) -> CliParser:
    """A replay command's parser. `reads`: it answers from one run, so it takes `--run`
    and the user's code (`--path`, `--import`); `migrate` rewrites every run and takes neither."""
    p: CliParser = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    p.add_argument("log", metavar="LOG", help="the log: a file, a run directory, an incident bundle (replay bundle) or a PostgreSQL URL")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    if reads:
        p.add_argument(
            "--run", metavar="RUN_ID",
            help="which run of the log (default: the last; required for a directory holding several)",
        )
        add_user_code_arguments(p)
        func = _opening_bundles(func)
    p.set_defaults(func=func)
    return p


def _opening_bundles(func: Any) -> Any:
    """`func` with its LOG argument unpacked first when it is an incident bundle."""

    def run(args: argparse.Namespace) -> int:
        from deepserve.cli.replay_bundle import resolve_log

        args.log = resolve_log(args.log)
        return func(args)

    return run


def _read(args: argparse.Namespace, *, note: bool = True) -> LogReader:
    """Open for reading without changing the file: an incident log is evidence. An older
    schema gets a one-line error that names `deepserve replay migrate`; a damaged file, or one
    cut after its closing record was written, is refused before anything is answered from it;
    a log its writer never closed gets one line of note on stderr (`note`: now)."""
    from deepserve.persistence import open_log

    load_user_code(args)
    require_driver(args.log)
    if os.path.isdir(args.log):
        _check_complete(args.log)
    reader = open_log(args.log, upgrade=False)
    try:
        reader.check_integrity()  # a log cut after its closing record was written stops here
        _check_run_choice(args, reader)
        args.end_state = _end_state(args, reader)
    except BaseException:
        reader.close()
        raise
    if note:
        _print_end_note(args)
    return reader


def _print_end_note(args: argparse.Namespace) -> None:
    if args.end_state.closed is False:
        print(f"deepserve: {unclosed_note(args.log, args.end_state.missing)}", file=sys.stderr)
    elif args.end_state.closed is None:
        print(f"deepserve: note: {args.log}: the run was written before closing records (log schema < 7): "
              "whether its log ends where the run did cannot be told", file=sys.stderr)


def _end_state(args: argparse.Namespace, reader: LogReader) -> EndState:
    """The run's end; in a run directory, a process log the daemon recorded as exited (a TE
    process killed, `daemon.db`'s ProcessExited) is the run's own story, not a log cut short."""
    from deepserve.persistence.api import EndState
    from deepserve.replay.verify_logs import exited_logs

    state = reader.run_end(args.run)
    if state.closed is not False or not os.path.isdir(args.log):
        return state
    exited = exited_logs(args.log)
    missing = tuple(m for m in state.missing if os.path.basename(m) not in exited)
    return EndState(not missing, missing)


def unclosed_note(log: str, missing: tuple[str, ...]) -> str:
    """The one line every replay command prints about a log its writer never closed."""
    who = f" ({', '.join(os.path.basename(m) for m in missing)})" if missing and missing != ("main",) else ""
    return (f"note: {log}: the run has no closing record{who}: its writer never closed the log (the "
            "process died, or still runs), so what follows is what the log holds up to its last step")


def _check_complete(directory: str) -> None:
    """A run directory missing a log its run wrote (a worker's, a TE process's) is refused:
    what is left would answer as if it were the whole run."""
    from deepserve.persistence.factory import log_files
    from deepserve.replay.verify_logs import missing_logs

    gone = missing_logs(directory, log_files(directory))
    if gone:
        raise CliError(f"{directory}: the run wrote {', '.join(gone)}, which the directory lacks: "
                       "it cannot be read as the whole run")  # fmt: skip


def _check_run_choice(args: argparse.Namespace, reader: LogReader) -> None:
    """A run directory holding more than one run has no obvious default: refuse to pick."""
    if args.run is not None or not os.path.isdir(args.log):
        return
    run_ids = list(dict.fromkeys(run.run_id for run in reader.runs()))
    if len(run_ids) > 1:
        raise CliError(
            f"{args.log} holds {len(run_ids)} runs ({', '.join(run_ids)}): choose one with --run"
        )


def _migrate(args: argparse.Namespace) -> int:
    from deepserve.persistence import migrate
    from deepserve.replay.integrity import check_integrity

    require_driver(args.log)
    check_integrity(args.log)  # never rewrite a damaged file: it would hide the damage
    _check_current_pages(args.log)
    done = migrate(args.log)
    if args.json:
        print_json({target: {"from": a, "to": b} for target, (a, b) in done.items()})
    else:
        for target, (before, after) in done.items():
            change = f"schema {before} -> {after}" if before != after else f"already schema {after}"
            print(f"{target}: {change}")
    return 0


def _check_current_pages(target: str) -> None:
    """A log already of the current schema gets the readers' whole check (its pages' CRCs and
    heads too): `migrate` said "already schema 4" of a file whose page failed its checksum."""
    from deepserve.persistence import open_log
    from deepserve.persistence.api import LogError

    try:
        reader = open_log(target, upgrade=False)
    except LogError:
        return  # an older schema (what migrate is for; its SQLite check ran) or unreadable
    try:
        reader.check_integrity()
    finally:
        reader.close()


def _verify(args: argparse.Namespace) -> int:
    from deepserve.replay.verifier import verify
    from deepserve.replay.verify_logs import one_run_per_process

    if one_run_per_process(args.log):  # a processes-mode run: one log per process, each verified alone
        return _verify_logs(args)
    result = verify(_read(args), args.run)
    if args.json:
        print_json(result)
    else:
        print(result.summary())
        if result.divergence is not None:
            _print_divergence(result.divergence)
    return _verify_status(result.identical, result.closed)


def _verify_status(identical: bool, closed: bool | None) -> int:
    if not identical:
        return EXIT_DIVERGED
    return EXIT_UNCLOSED if closed is False else 0


def _verify_logs(args: argparse.Namespace) -> int:
    from deepserve.replay.verify_logs import verify_logs

    load_user_code(args)
    verdict = verify_logs(args.log, args.run)
    unclosed = tuple(f"{v.log}" for v in verdict.logs if v.result.closed is False)
    if unclosed:
        print(f"deepserve: {unclosed_note(args.log, unclosed)}", file=sys.stderr)
    status = _verify_status(verdict.identical, False if unclosed else True)
    if args.json:
        print_json(verdict)
        return status
    print(verdict.summary())
    for v in verdict.logs:
        print(f"  {v.log}: {v.result.summary()}")
        if v.result.divergence is not None:
            _print_divergence(v.result.divergence)
    return status


def _print_divergence(d: Divergence) -> None:
    inp = d.input
    corr = f" corr={inp['corr']}" if inp.get("corr") is not None else ""
    print(f"  actor:    {d.actor}")
    print(f"  seq:      {d.seq}")
    print(f"  input:    {inp['type']} {compact(inp['payload'], 400)} from {inp['src']}{corr}")
    print(f"  expected: {_describe(d.expected)}")
    print(f"  actual:   {_describe(d.actual)}")


def _describe(view: Any) -> str:
    if view is None:
        return "(nothing)"
    return compact(view, 600)


def _state(args: argparse.Namespace) -> int:
    from deepserve.replay.state import state_at

    if args.at is not None and args.at < 0:  # clocks start at 0 (virtual) or the epoch (wall)
        raise CliError(f"--at {args.at:g}: a clock time is never negative (seconds; a simulation's "
                       "clock starts at 0)")  # fmt: skip
    if args.cluster:
        return _cluster_state(args)
    st = state_at(_read(args), args.actor, args.at, args.run)
    data = st.state_data()
    if args.json:
        fields = msgspec.structs.asdict(st)
        fields["state"] = data
        print_json(fields)
        return 0
    status = "alive" if st.alive else "stopped"
    if st.cut:  # a killed process's log just ends (a tour: "alive" for an actor killed before --at)
        status = ("alive at its last record; its log ends there without a final snapshot (its process "
                  "was killed, or still runs): nothing later is known")  # fmt: skip
    when = "end of log" if st.at is None else f"t={st.at:g}"
    print(f"{st.actor} at {when}: after #{st.seq} (t={st.t:.6f}), {status}, {st.events} events folded")
    print_pretty_json(data)
    return 0


def _cluster_state(args: argparse.Namespace) -> int:
    from deepserve.replay.cluster_state import cluster_lines, cluster_state_at

    view = cluster_state_at(_read(args), args.at, args.run)
    if args.json:
        print_json(msgspec.to_builtins(view))
    else:
        print("\n".join(cluster_lines(view)))
    return 0


def _log(args: argparse.Namespace) -> int:
    if args.since is not None and args.until is not None and args.since > args.until:
        raise CliError(f"empty time range: --since {args.since:g} is after --until {args.until:g}")
    from deepserve.replay.listings import check_filters, listing, listing_records

    reader = _read(args)
    filters = dict(actor=args.actor, corr=args.corr, since=args.since, until=args.until, run_id=args.run)
    check_filters(reader, **filters)
    shown = 0
    if args.json:
        for record in listing_records(reader, **filters):
            print_json(record)
            shown += 1
    else:
        out = sys.stdout
        for line in listing(reader, **filters):
            out.write(line + "\n")
            shown += 1
    if shown == 0:  # each filter names something the run holds, together they select nothing
        chosen = [f"{k} {v!r}" if isinstance(v, str) else f"{k} {v:g}"
                  for k, v in filters.items() if v is not None and k != "run_id"]
        print(f"no inputs match ({', '.join(chosen)})", file=sys.stderr)
    return 0


def _why(args: argparse.Namespace) -> int:
    from deepserve.replay.common import ReplayError
    from deepserve.replay.why import request_hops, why_lines

    reader = _read(args, note=False)  # an error below is the one line, and says it itself
    try:
        hops = request_hops(reader, args.request_id, args.run)
    except ReplayError as exc:
        if args.end_state.closed is False and str(exc).startswith("no request"):
            # not "never arrived": the log stops where its process died, and it may have come after
            raise ReplayError(f"request {args.request_id!r} is not in the log, which ends before it could "
                              "tell: the run has no closing record (its process died, or still runs), so "
                              "the request may have arrived after its last step") from None  # fmt: skip
        raise
    if args.json:
        print_json({"request_id": args.request_id, "hops": hops})
    else:
        for line in why_lines(hops):
            print(line)
    _print_end_note(args)
    return 0


def _digest(args: argparse.Namespace) -> int:
    from deepserve.replay.digests import digest

    value = digest(_read(args), args.run)
    if args.json:
        print_json({"digest": value})
    else:
        print(value)
    return 0
