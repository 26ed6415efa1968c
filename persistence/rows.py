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

Checksums (schema v5) — every row ends with `crc32`, before the step id a reader
appends: `zlib.crc32` of the msgpack of the row's record values as the database gives
them back, with its step's id (`child_crc`), and for an input row also the number of
its step's event, output and snapshot rows (`input_crc`): a row changed, moved to
another step, deleted or added is refused. A `runs` row sums its values (`row_crc`).
SQLite checks its own structures, not what a row holds: one flipped byte in a payload
used to replay as another message with exit 0. The row
builder stores what SQLite gives back, so that what is read is what was summed: REAL
fields as floats with -0.0 as 0.0, booleans as 0/1 (SQLite has none; PostgreSQL's
writer turns them back into booleans for COPY, its readers into 0/1 again,
`ints_for_bools`). `group_steps` checks every row it assembles and raises
`DamagedRow`. Cost: ~0.5 µs a row to sum when written and again when read.
"""

from __future__ import annotations

import hashlib
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import msgspec

from .errors import LogError

Row = Sequence[Any]
_encode = msgspec.msgpack.Encoder().encode
_crc32 = zlib.crc32

# Positions of the REAL and boolean fields in each record's values, as `_input_values`,
# `_output_values` and `run_row` use them (core/records.py; tests/persistence checks them
# against the structs: this module cannot import core).
INPUT_FLOATS, INPUT_BOOLS = (2,), (9, 12)  # InputRec.t; .external, .ask
OUTPUT_FLOATS, OUTPUT_BOOLS = (6,), (10,)  # OutputRec.delay; .ask
RUN_FLOATS = (6,)  # RunRec.started_at


class DamagedRow(LogError):
    """A row whose values do not match its checksum (the text is completed by the
    reader, which knows the log's name)."""


def row_crc(values: Sequence[Any]) -> int:
    """A `runs` row's checksum: its record values (see the module docstring)."""
    return _crc32(_encode(values))


def child_crc(step_id: int, values: Sequence[Any]) -> int:
    """An event, output or snapshot row's checksum: its step's id and its record values."""
    return _crc32(_encode((step_id, values)))


def input_crc(step_id: int, values: Sequence[Any], events: int, outputs: int, snapshot: bool) -> int:
    """An input row's checksum: its step's id, its record values and how many event,
    output and snapshot rows the step has. (`step_rows` and `group_steps` inline these.)"""
    return _crc32(_encode((step_id, values, events, outputs, snapshot)))


def _real(x: Any) -> float:
    """A REAL column's value as SQLite gives it back."""
    return x if x.__class__ is float and x else float(x) + 0.0  # an int, or -0.0 -> 0.0


# The two record kinds with REAL or boolean fields, written out: this is the writer's
# per-row budget (~0.6 µs a row, half of it crc32; a loop over the positions cost 2x).
def _input_values(values: Iterable[Any]) -> list[Any]:
    """An input's values as SQLite gives them back."""
    v = list(values)
    v[2] = _real(v[2])
    v[9] = 1 if v[9] else 0
    v[12] = 1 if v[12] else 0
    return v


def _output_values(values: Iterable[Any]) -> list[Any]:
    """An output's values as SQLite gives them back."""
    v = list(values)
    v[6] = _real(v[6])
    v[10] = 1 if v[10] else 0
    return v


def run_row(values: Iterable[Any]) -> list[Any]:
    """A `runs` row: the run record's values and their checksum."""
    v = list(values)
    v[6] = _real(v[6])
    v.append(_crc32(_encode(v)))
    return v


LEGACY_END = -1  # a closing record's `steps` for a run written before schema v7


class RunningDigest:
    """A run's closing-record sums as its writer keeps them: steps and units (input rows in the
    row layout, pages in the paged layout) stored, and blake2b-128 of every unit's CRC-32 in
    log order, 4 bytes little-endian each. The CRCs are summed already (rows above, pages'
    bodies), so keeping it costs one hash update per batch; a reader sums the same stored CRCs
    back (`run_ends.py`)."""

    __slots__ = ("_hash", "steps", "units")

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.steps = 0
        self.units = 0

    def add(self, crcs: Sequence[int], steps: int) -> None:
        self._hash.update(struct.pack(f"<{len(crcs)}I", *crcs))
        self.units += len(crcs)
        self.steps += steps

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def end_row(self, run_id: str, process: str) -> list[Any]:
        """The `run_ends` row (`schema.INSERT_COLUMNS` order), its checksum last."""
        return end_row(run_id, process, self.steps, self.units, self.hexdigest(), time.time())


def end_row(run_id: str, process: str, steps: int, units: int, digest: str, ended_at: float) -> list[Any]:
    v: list[Any] = [run_id, process, steps, units, digest, _real(ended_at)]
    v.append(_crc32(_encode(v)))
    return v


class StepRows(NamedTuple):
    """INSERT parameters of a batch of steps, one flat list per table."""

    inputs: list[Any]
    events: list[Any]
    outputs: list[Any]
    snapshots: list[Any]


STEP_TABLES = StepRows._fields  # the order `step_rows` fills them in


def step_rows(
    steps: Iterable[Any], run_id: str, ids: Iterable[int], fields: Callable[[Any], Iterable[Any]]
) -> StepRows:
    """Rows of `steps` (see the module docstring), each ending with its checksum; `ids`:
    the steps' ids, in order. Flat lists, not a tuple per row: this loop is the writer
    thread's CPU budget."""
    ins: list[Any] = []
    evs: list[Any] = []
    outs: list[Any] = []
    snaps: list[Any] = []
    for sid, (inp, events, outputs, snap) in zip(ids, steps, strict=True):
        n_evs = n_outs = 0
        for e in events:
            v = tuple(fields(e))  # strings, ints and bytes only: stored as they are
            evs.append(sid)
            evs.append(run_id)
            evs += v
            evs.append(_crc32(_encode((sid, v))))
            n_evs += 1
        for o in outputs:
            ov = _output_values(fields(o))
            outs.append(sid)
            outs.append(run_id)
            outs += ov
            outs.append(_crc32(_encode((sid, ov))))
            n_outs += 1
        if snap is not None:
            v = tuple(fields(snap))
            snaps.append(sid)
            snaps.append(run_id)
            snaps += v
            snaps.append(_crc32(_encode((sid, v))))
        iv = _input_values(fields(inp))
        ins.append(sid)
        ins.append(run_id)
        ins += iv
        ins.append(_crc32(_encode((sid, iv, n_evs, n_outs, snap is not None))))
    return StepRows(ins, evs, outs, snaps)


def rows_of(flat: list[Any], ncols: int) -> list[tuple]:
    """A flat parameter list as row tuples of `ncols` values."""
    if len(flat) % ncols:  # a record of another shape would shift every column
        raise ValueError(f"{len(flat)} values do not make rows of {ncols} columns")
    return list(zip(*[iter(flat)] * ncols, strict=True))


def _damaged(table: str, step: int) -> DamagedRow:
    return DamagedRow(f"damaged log: the {table} row of step {step} does not match its checksum "
                      "(its record cannot be trusted)")  # fmt: skip


def check_rows(table: str, rows: Sequence[Row]) -> None:
    """Raise `DamagedRow` for the first child row (values, crc32, step id) that does not
    match its checksum (which sums the step id with the values: a row moved to another
    step fails it)."""
    for r in rows:
        if _crc32(_encode((r[-1], r[:-2]))) != r[-2]:
            raise _damaged(table, r[-1])


def ints_for_bools(row: Row) -> tuple:
    """A row with its booleans as 0/1, as SQLite returns them (PostgreSQL's readers)."""
    return tuple(int(x) if x.__class__ is bool else x for x in row)


def group_steps(
    ins: Sequence[Row], evs: Sequence[Row], outs: Sequence[Row], snaps: Sequence[Row]
) -> list[tuple]:
    """Step tuples from rows ending with (crc32, step id), each checked against its
    checksum: a child row's sums its step id, an input row's also how many event,
    output and snapshot rows its step has (a row deleted, added or moved to another
    step fails it). Child rows ordered by step id then insertion; child rows of steps
    not in `ins` (a dense range fetch under a filter) are checked but never looked up."""
    for table, rows in (("events", evs), ("outputs", outs), ("snapshots", snaps)):
        check_rows(table, rows)
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
        if by_snap.setdefault(r[-1], r) is not r:  # a second snapshot row: one is not ours
            raise _damaged("snapshots", r[-1])
    none: list[Row] = []  # shared: converting or encoding never mutates it
    ev, out, snap = by_ev.get, by_out.get, by_snap.get
    steps = []
    for r in ins:
        sid = r[-1]
        step = (r, ev(sid, none), out(sid, none), snap(sid))
        if _crc32(_encode((sid, r[:-2], len(step[1]), len(step[2]), step[3] is not None))) != r[-2]:
            raise _damaged("inputs", sid)
        steps.append(step)
    return steps


def id_range_is_dense(ids: Sequence[int]) -> bool:
    """Fetch the children of steps `ids` (ascending) by `BETWEEN first AND last` (one
    index range scan) rather than `IN (...)` when they are most of that range."""
    return bool(ids) and ids[-1] - ids[0] < 2 * len(ids)
