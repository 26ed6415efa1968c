"""A readable listing of a run: one line per input, its events and outputs indented.

Streams: lines are produced as steps are read, so a listing of a long log starts
printing at once and never holds the log in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from deepserve.core.records import (
    CANCEL,
    DEAD,
    DELIVERED,
    FULL,
    LATE,
    SNAPSHOT,
    SPAWN,
    STOP,
    TIMER,
    Step,
)
from deepserve.persistence.api import LogReader

from .common import (
    ReplayError,
    compact,
    event_view,
    first_few,
    input_view,
    output_view,
    pick_run,
    snapshot_view,
    some,
)

INDENT = " " * 16  # under the actor column, so a step reads as a block

# What a non-delivered input was, in words: one label per `InputKind`, so a new kind
# shows as its number rather than as some other kind's label.
INPUT_LABELS: dict[int, str] = {
    DEAD: "dead letter",
    FULL: "dropped: mailbox full",
    SNAPSHOT: "final state: snapshot at run end or stop",
    LATE: "late answer: its ask had already settled, not delivered",
}


def input_label(kind: int) -> str | None:
    """The listing's note for an input of this kind (None for a delivery)."""
    if kind == DELIVERED:
        return None
    return INPUT_LABELS.get(kind, f"unknown input kind {kind}")


def check_filters(
    reader: LogReader,
    actor: str | None = None,
    corr: str | None = None,
    since: float | None = None,
    until: float | None = None,
    run_id: str | None = None,
) -> None:
    """Refuse a filter that names something the run does not hold, and an empty time
    range, with one line saying what exists: a silent empty listing reads as "nothing
    happened", which is a wrong answer."""
    if since is not None and until is not None and since > until:
        raise ReplayError(f"empty time range: --since {since:g} is after --until {until:g}")
    run = pick_run(reader, run_id)
    if actor is not None and next(iter(reader.steps(run.run_id, actor=actor)), None) is None:
        raise ReplayError(
            f"no actor {actor!r} in run {run.run_id!r} (actors: {some(reader.actors(run.run_id))})"
        )
    if corr is not None and next(iter(reader.steps(run.run_id, corr=corr)), None) is None:
        raise ReplayError(
            f"no input with corr {corr!r} in run {run.run_id!r} "
            f"(correlation ids: {_first_corrs(reader, run.run_id)})"
        )


def _first_corrs(reader: LogReader, run_id: str, limit: int = 8) -> str:
    """The first distinct correlation ids of a run, in log order (`first_few`: reading
    stops at the first one past `limit`; a count would read the whole run)."""
    return first_few(_distinct_corrs(reader, run_id, limit + 1), limit)


def _distinct_corrs(reader: LogReader, run_id: str, limit: int) -> list[str]:
    """The first `limit` distinct correlation ids of a run, in log order (stops reading early)."""
    seen: dict[str, None] = {}
    for step in reader.steps(run_id):
        corr = step.input.corr
        if corr is not None and corr not in seen:
            seen[corr] = None
            if len(seen) == limit:
                break
    return list(seen)


def listing_records(
    reader: LogReader,
    actor: str | None = None,
    corr: str | None = None,
    since: float | None = None,
    until: float | None = None,
    run_id: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The selected steps as plain data (the `--json` form of the listing)."""
    run = pick_run(reader, run_id)
    for step in reader.steps(run.run_id, actor=actor, corr=corr, since=since, until=until):
        view = input_view(step.input)
        label = input_label(step.input.kind)
        if label is not None:
            view["label"] = label
        view["events"] = [event_view(ev) for ev in step.events]
        view["outputs"] = [output_view(o) for o in step.outputs]
        if step.snapshot is not None:
            view["snapshot"] = snapshot_view(step.snapshot)
        yield view


def listing(
    reader: LogReader,
    actor: str | None = None,
    corr: str | None = None,
    since: float | None = None,
    until: float | None = None,
    run_id: str | None = None,
) -> Iterator[str]:
    """Lines of text: `time  actor#seq  src→dst  Type {payload}  corr=…`, then
    the step's events (`event`) and outputs (`send`, `timer`, …) indented."""
    run = pick_run(reader, run_id)
    for step in reader.steps(run.run_id, actor=actor, corr=corr, since=since, until=until):
        yield from _step_lines(step)


def _step_lines(step: Step) -> Iterator[str]:
    rec = step.input
    view = input_view(rec)
    where = f"{rec.actor}#{rec.seq}" if rec.kind == DELIVERED else f"{rec.actor}#{view['kind']}"
    line = f"{rec.t:12.6f}  {where}  {rec.src}→{rec.actor}  {rec.type} {compact(view['payload'])}"
    if rec.corr is not None:
        line += f"  corr={rec.corr}"
    label = input_label(rec.kind)
    if label is not None:
        line += f"  ({label})"
    yield line
    for ev in step.events:
        e = event_view(ev)
        yield f"{INDENT}event   {e['type']} {compact(e['payload'])}"
    for o in step.outputs:
        yield INDENT + _output_line(o.kind, output_view(o), rec.corr)
    if step.snapshot is not None:
        yield f"{INDENT}snapshot {step.snapshot.type} ({len(step.snapshot.payload)} bytes)"


def _output_line(kind: int, o: dict[str, Any], input_corr: str | None) -> str:
    body = f"{o.get('type', '')} {compact(o.get('payload'))}" if "type" in o else ""
    if kind == TIMER:
        text = f"timer   +{o.get('delay', 0.0):g}s key={o.get('key')} {body}"
    elif kind == CANCEL:
        text = f"cancel  key={o.get('key')}"
    elif kind == SPAWN:
        payload = o.get("payload") or {}
        text = f"spawn   {o['dst']} {payload.get('cls', '?') if isinstance(payload, dict) else payload}"
    elif kind == STOP:
        text = f"stop    {o['dst']}"
    else:
        text = f"send    →{o['dst']} {body}"
        if o.get("reply_to") is not None:
            text += f"  reply_to={o['reply_to']}"
    if o.get("corr") != input_corr and kind not in (CANCEL, STOP):
        text += f"  corr={o.get('corr')}"  # only when it differs: most outputs inherit it
    return text.rstrip()
