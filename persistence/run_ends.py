"""Reading a run's closing record (schema v7, `schema.run_ends`): was the log closed cleanly,
and does it still hold what its writer closed it with?

A writer stores a closing record per run when its sink closes cleanly (`GroupCommitSink` after
its last commit, the writer process on the FINISH frame): the steps and units it stored and
`rows.RunningDigest` of those units' CRC-32s. Three answers:

- closed: every process of the run left one, and the steps present agree with it;
- not closed: a process left none (it died, or still writes): the log is whole as far as it
  goes, but nothing says how far the run went (`EndState.closed` False, the processes named);
- cut or changed after its end was written: the steps present disagree with the record
  (`check_ends` raises the one-line `LogError`: a log whose last steps or pages were deleted
  leaves no gap in the step ids, so this is what tells it from a whole one).

A run the v6 -> v7 migration found has a record with `steps` = LEGACY_END: written before
closing records existed, its end is unknown (`EndState.closed` None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Row, select
from sqlalchemy.sql import Executable

from .api import EndState
from .errors import LogError
from .rows import LEGACY_END, RunningDigest, end_row
from .schema import RUN_END_FIELDS, inputs, pages, run_ends, runs

CHUNK = 4096  # stored CRCs fetched at a time


class _Db(Protocol):
    label: str

    def all(self, stmt: Executable) -> Sequence[Row]: ...

    def chunks(self, stmt: Executable, size: int) -> Any: ...


def _ends(db: _Db, run_id: str) -> dict[str, tuple[Any, ...]]:
    """The run's closing records by process, each checked against its checksum."""
    cols = [run_ends.c[f] for f in RUN_END_FIELDS]
    found: dict[str, tuple[Any, ...]] = {}
    for row in db.all(select(*cols, run_ends.c.crc32).where(run_ends.c.run_id == run_id)
                      .order_by(run_ends.c.id)):  # fmt: skip
        values = tuple(row)
        if end_row(*values[:-1])[-1] != values[-1]:
            raise LogError(f"{db.label}: damaged log: the closing record of run {run_id!r} does not "
                           "match its checksum (it cannot be trusted)")  # fmt: skip
        found[values[1]] = values
    return found


def _processes(db: _Db, run_id: str) -> list[str]:
    rows = db.all(select(runs.c.process).where(runs.c.run_id == run_id).order_by(runs.c.id))
    return list(dict.fromkeys(r[0] for r in rows))


def end_state(db: _Db, run_id: str) -> EndState:
    ends = _ends(db, run_id)
    if any(e[2] == LEGACY_END for e in ends.values()):
        return EndState(None)
    missing = tuple(p for p in _processes(db, run_id) if p not in ends)
    return EndState(not missing, missing)


def _held(db: _Db, run_id: str, paged: bool) -> RunningDigest:
    """The run's sums over what the log holds now, as its writer summed them."""
    held = RunningDigest()
    if paged:
        stmt = select(pages.c.steps, pages.c.crc32).where(pages.c.run_id == run_id).order_by(pages.c.id)
        for chunk in db.chunks(stmt, CHUNK):
            held.add([r[1] for r in chunk], sum(r[0] for r in chunk))
    else:
        stmt = select(inputs.c.crc32).where(inputs.c.run_id == run_id).order_by(inputs.c.id)
        for chunk in db.chunks(stmt, CHUNK):
            held.add([r[0] for r in chunk], len(chunk))
    return held


def check_ends(db: _Db, run_id: str, paged: bool) -> None:
    """`LogError` if the run's closing records disagree with the steps the log holds."""
    ends = [e for e in _ends(db, run_id).values() if e[2] != LEGACY_END]
    if not ends:
        return  # not closed (or before v7): nothing to hold the steps to
    held = _held(db, run_id, paged)
    closed = sum(e[2] for e in ends)
    if len(ends) == 1 and len(_processes(db, run_id)) == 1:
        _, _, steps, units, digest, _, _ = ends[0]
        if (steps, units, digest) == (held.steps, held.units, held.hexdigest()):
            return
    elif len(ends) < len(_processes(db, run_id)) or closed == held.steps:
        # processes sharing one database (PostgreSQL) interleave their rows: only the sum of
        # their counts can be held to what is there, once every one of them has closed
        return
    if closed != held.steps:
        what = f"it holds {held.steps:,}" if held.steps else "it holds none of them"
        raise LogError(f"{db.label}: damaged log: run {run_id!r} was closed with {closed:,} steps, but "
                       f"{what}: the log was cut after its end was written (its last steps or pages "
                       "deleted), and cannot be read as the run")  # fmt: skip
    raise LogError(f"{db.label}: damaged log: run {run_id!r} holds the {closed:,} steps it was closed "
                   "with, but not the ones its closing record sums (rows or pages replaced after its "
                   "end was written): it cannot be read as the run")  # fmt: skip
