"""Pure conversions between kernel records and table rows (the functional core).

Writing: a batch of queued items (steps, and run records that switch the current
run) becomes one tuple list per table. Reading: an ordered chunk of input rows plus
the child rows of those steps (each list ordered by step id) become `Step`s again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from msgspec.structs import astuple

from deepserve.core.records import EventRec, InputRec, OutputRec, RunRec, SnapshotRec, Step

Row = Sequence[Any]


class BatchRows(NamedTuple):
    runs: list[tuple]
    inputs: list[tuple]
    events: list[tuple]
    outputs: list[tuple]
    snapshots: list[tuple]
    run_id: str | None  # current run after the batch
    steps: int


def count_steps(items: Iterable[Step | RunRec]) -> int:
    return sum(1 for item in items if type(item) is Step)


def batch_rows(items: Iterable[Step | RunRec], run_id: str | None, ids: Iterator[int]) -> BatchRows:
    """Rows for one transaction. `ids` yields the step ids (= input row ids) in order;
    a `RunRec` item makes the following steps belong to its run."""
    runs: list[tuple] = []
    ins: list[tuple] = []
    evs: list[tuple] = []
    outs: list[tuple] = []
    snaps: list[tuple] = []
    n = 0
    for item in items:
        if type(item) is not Step:
            runs.append(astuple(item))
            run_id = item.run_id
            continue
        if run_id is None:
            raise ValueError("a step was appended before begin_run()")
        head = (next(ids), run_id)
        ins.append(head + astuple(item.input))
        for e in item.events:
            evs.append(head + astuple(e))
        for o in item.outputs:
            outs.append(head + astuple(o))
        if item.snapshot is not None:
            snaps.append(head + astuple(item.snapshot))
        n += 1
    return BatchRows(runs, ins, evs, outs, snaps, run_id, n)


def run_from_row(row: Row) -> RunRec:
    return RunRec(*row)


def snapshot_from_row(row: Row) -> SnapshotRec:
    """`row` is (step_id, *SNAPSHOT_FIELDS)."""
    return SnapshotRec(*row[1:])


def _children(
    rows: Sequence[Row], pos: int, sid: int, make: Callable[..., Any]
) -> tuple[list, int]:
    """Records of step `sid` from rows ordered by step id, starting at `pos`; rows of
    steps that were not selected (a dense id range fetch) are skipped."""
    n = len(rows)
    while pos < n and rows[pos][0] < sid:
        pos += 1
    found = []
    while pos < n and rows[pos][0] == sid:
        found.append(make(*rows[pos][1:]))
        pos += 1
    return found, pos


def join_steps(
    inputs: Sequence[Row], events: Sequence[Row], outputs: Sequence[Row], snapshots: Sequence[Row]
) -> list[Step]:
    """`inputs` rows are (id, *INPUT_FIELDS); child rows are (step_id, *FIELDS).
    All four ordered by step id (children by step id, then insertion order)."""
    steps = []
    ep = op = sp = 0
    for row in inputs:
        sid = row[0]
        evs, ep = _children(events, ep, sid, EventRec)
        outs, op = _children(outputs, op, sid, OutputRec)
        snap, sp = _children(snapshots, sp, sid, SnapshotRec)
        steps.append(Step(InputRec(*row[1:]), evs, outs, snap[0] if snap else None))
    return steps


def id_range_is_dense(ids: Sequence[int]) -> bool:
    """Fetch children by `BETWEEN first AND last` (one index range scan) rather than
    `IN (...)` when the selected steps are most of that range."""
    return bool(ids) and ids[-1] - ids[0] < 2 * len(ids)
