"""Steps to rows and rows to steps: the one row builder and the one step assembly
(the functional core of every SQL backend). Standard library and msgspec only: the
child processes (`sqlite/child.py`) run both.

Columns are named and ordered like the fields of the kernel's record structs
(`schema.py`), so a record's row is its field values behind a short prefix.

Writing — `step_rows`: steps become one flat parameter list per table (inputs,
events, outputs, snapshots), each row `[step id, run id, *fields]` in
`schema.INSERT_COLUMNS` order. A step is anything that unpacks as `(input, events,
outputs, snapshot)` and whose records `fields` turns into their values (`Step`
structs and `astuple`, in the thread writers and PostgreSQL's). `rows_of` cuts a flat
list into row tuples (COPY). The writer process writes no rows: it stores pages
(`pages.py`).

Reading — `group_steps`: input rows and the child rows of those steps, every row
ending with its step id, become step tuples `(input row, [event rows], [output
rows], snapshot row or None)`. `Step` and its records are array-like structs and
msgspec ignores trailing array items, so a list of step tuples converts
(`msgspec.convert(..., list[Step], strict=False)`) or encodes and decodes (through
a pipe) into `Step`s in one C call, with no per-row slicing. Booleans come back from
SQLite as 0/1: lax mode (`strict=False`) takes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

Row = Sequence[Any]


class StepRows(NamedTuple):
    """INSERT parameters of a batch of steps, one flat list per table."""

    inputs: list[Any]
    events: list[Any]
    outputs: list[Any]
    snapshots: list[Any]


STEP_TABLES = StepRows._fields  # the order `step_rows` fills them in


def step_rows(
    steps: Iterable[Any], run_id: str, first_id: int, fields: Callable[[Any], Iterable[Any]]
) -> StepRows:
    """Rows of `steps` (see the module docstring); step ids count from `first_id`.
    Flat lists, not a tuple per row: this loop is the writer process's CPU budget."""
    ins: list[Any] = []
    evs: list[Any] = []
    outs: list[Any] = []
    snaps: list[Any] = []
    sid = first_id
    for inp, events, outputs, snap in steps:
        ins.append(sid)
        ins.append(run_id)
        ins += fields(inp)
        for e in events:
            evs.append(sid)
            evs.append(run_id)
            evs += fields(e)
        for o in outputs:
            outs.append(sid)
            outs.append(run_id)
            outs += fields(o)
        if snap is not None:
            snaps.append(sid)
            snaps.append(run_id)
            snaps += fields(snap)
        sid += 1
    return StepRows(ins, evs, outs, snaps)


def rows_of(flat: list[Any], ncols: int) -> list[tuple]:
    """A flat parameter list as row tuples of `ncols` values."""
    if len(flat) % ncols:  # a record of another shape would shift every column
        raise ValueError(f"{len(flat)} values do not make rows of {ncols} columns")
    return list(zip(*[iter(flat)] * ncols, strict=True))


def group_steps(ins: Sequence[Row], evs: Sequence[Row], outs: Sequence[Row], snaps: Sequence[Row]) -> list[tuple]:
    """Step tuples from rows whose last column is the step id; child rows ordered by
    step id then insertion. Child rows of steps not in `ins` (a dense range fetch
    under a filter) are never looked up."""
    by_ev: dict[int, list[Row]] = {}
    for r in evs:
        got = by_ev.get(r[-1])
        if got is None:
            by_ev[r[-1]] = [r]
        else:
            got.append(r)
    by_out: dict[int, list[Row]] = {}
    for r in outs:
        got = by_out.get(r[-1])
        if got is None:
            by_out[r[-1]] = [r]
        else:
            got.append(r)
    by_snap: dict[int, Row] = {}
    for r in snaps:
        by_snap.setdefault(r[-1], r)
    none: list[Row] = []  # shared: converting or encoding never mutates it
    ev, out, snap = by_ev.get, by_out.get, by_snap.get
    return [(r, ev(r[-1], none), out(r[-1], none), snap(r[-1])) for r in ins]


def id_range_is_dense(ids: Sequence[int]) -> bool:
    """Fetch the children of steps `ids` (ascending) by `BETWEEN first AND last` (one
    index range scan) rather than `IN (...)` when they are most of that range."""
    return bool(ids) and ids[-1] - ids[0] < 2 * len(ids)
