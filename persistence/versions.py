"""Schema versions: create a new log, refuse what cannot be read, migrate old logs.

Each migration moves a database from version v to v+1 inside the caller's
transaction (DDL is transactional on SQLite and PostgreSQL), so a failed or
interrupted migration leaves the log at its old version, whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Connection,
    Table,
    Text,
    bindparam,
    false,
    func,
    insert,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.schema import CreateColumn

from .errors import LogError
from .rows import LEGACY_END, child_crc, end_row, input_crc, ints_for_bools, row_crc
from .schema import (
    EVENT_FIELDS,
    INPUT_FIELDS,
    INSERT_COLUMNS,
    OUTPUT_FIELDS,
    RUN_FIELDS,
    SCHEMA_VERSION,
    SNAPSHOT_FIELDS,
    TABLES,
    inputs,
    metadata,
    runs,
    schema_version,
)

# Serializes schema creation/migration between processes sharing one PostgreSQL database.
_PG_SCHEMA_LOCK = 0x64656570  # "deep"


def _v1_to_v2(conn: Connection) -> None:
    """v2 adds `runs.process`; every v1 log was written by a single process."""
    col = Column("process", Text, nullable=False, server_default="main")
    conn.execute(
        text(f"ALTER TABLE runs ADD COLUMN {CreateColumn(col).compile(dialect=conn.dialect)}")
    )


def _v2_to_v3(conn: Connection) -> None:
    """v3 logs the envelope's `ask` flag and the sender's HLC on every input. A v2
    log replays as before for handlers that never read them (ask=false, src_hlc=0)."""
    for col in (
        Column("ask", Boolean, nullable=False, server_default=false()),
        Column("src_hlc", BigInteger, nullable=False, server_default="0"),
    ):
        ddl = CreateColumn(col).compile(dialect=conn.dialect)
        conn.execute(text(f"ALTER TABLE inputs ADD COLUMN {ddl}"))


def _v3_to_v4(conn: Connection) -> None:
    """v4 adds the `pages` table (the paged layout of the writer process); a v3 log's
    runs are all rows and read as before."""
    metadata.tables["pages"].create(conn)  # with its index


_CHILDREN = {"events": EVENT_FIELDS, "outputs": OUTPUT_FIELDS, "snapshots": SNAPSHOT_FIELDS}
MIGRATION_CHUNK = 5000  # rows summed per UPDATE round: memory stays bounded on any log


def _v4_to_v5(conn: Connection) -> None:
    """v5 adds `crc32` to every row of the row layout and to `runs` (rows.py), summed
    here over what each row holds now: from here on a damaged byte is caught on read.
    (The sums certify the rows as they are: damage from before cannot be told apart.)"""
    for name in ("runs", "inputs", *_CHILDREN):
        col = Column("crc32", BigInteger, nullable=False, server_default="0")
        conn.execute(text(f"ALTER TABLE {name} ADD COLUMN {CreateColumn(col).compile(dialect=conn.dialect)}"))
    _sum_rows(conn, runs, RUN_FIELDS, lambda r: row_crc(r[1:]))
    for name, fields in _CHILDREN.items():
        _sum_rows(conn, metadata.tables[name], ("step_id", *fields), lambda r: child_crc(r[1], r[2:]))
    counts = _ChildCounts(conn)
    _sum_rows(conn, inputs, INPUT_FIELDS, counts.input_crc)


def _v5_to_v6(conn: Connection) -> None:
    """v6 lets a page's body be a zstd frame (pages.py). A v5 log's pages are msgpack as they
    were, and read as before: the version is recorded so that an older deepserve refuses a v6
    log ("newer than this deepserve supports") instead of calling its pages damaged."""


def _v6_to_v7(conn: Connection) -> None:
    """v7 adds `run_ends`, the closing record a writer stores when it closes its log cleanly.
    A run already in the log was written before closing records existed: it gets one saying
    so (`steps` = LEGACY_END), so that it reads as "its end was not recorded", not as a run
    whose process died."""
    run_ends = metadata.tables["run_ends"]
    run_ends.create(conn)  # with its index
    found = conn.execute(select(runs.c.run_id, runs.c.process).order_by(runs.c.id)).all()
    rows = [dict(zip(INSERT_COLUMNS["run_ends"], end_row(r[0], r[1], LEGACY_END, 0, "", time.time()), strict=True))
            for r in found]  # fmt: skip
    if rows:
        conn.execute(insert(run_ends), rows)


def _sum_rows(conn: Connection, table: Table, cols: tuple[str, ...], crc: Callable[[tuple], int]) -> None:
    """Set every row's crc32 to `crc((id, *cols))`, booleans as 0/1, a chunk of rows at a time."""
    stmt = update(table).where(table.c.id == bindparam("row_id")).values(crc32=bindparam("crc"))
    last = 0
    while True:
        rows = conn.execute(select(table.c.id, *(table.c[c] for c in cols)).where(table.c.id > last)
                            .order_by(table.c.id).limit(MIGRATION_CHUNK)).all()  # fmt: skip
        if not rows:
            return
        conn.execute(stmt, [{"row_id": r[0], "crc": crc(ints_for_bools(r))} for r in rows])
        last = rows[-1][0]


class _ChildCounts:
    """How many event, output and snapshot rows each step has (an input row's sum)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.counts: dict[int, list[int]] = {}
        self.lo = self.hi = 0  # the step ids whose counts are loaded: lo .. hi - 1

    def input_crc(self, r: tuple) -> int:
        sid = r[0]
        if not self.lo <= sid < self.hi:
            self._load(sid)
        n = self.counts.get(sid, (0, 0, 0))
        return input_crc(sid, r[1:], n[0], n[1], n[2] > 0)

    def _load(self, first: int) -> None:
        """The counts of steps first .. first + MIGRATION_CHUNK - 1 (inputs come in id order)."""
        self.counts.clear()
        self.lo, self.hi = first, first + MIGRATION_CHUNK
        for i, name in enumerate(_CHILDREN):
            t = metadata.tables[name]
            q = (select(t.c.step_id, func.count()).where(t.c.step_id.between(first, first + MIGRATION_CHUNK - 1))
                 .group_by(t.c.step_id))  # fmt: skip
            for sid, n in self.conn.execute(q):
                self.counts.setdefault(sid, [0, 0, 0])[i] = n


# version v -> the step that upgrades a v database to v+1
MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7,
}  # fmt: skip


def stored_version(conn: Connection, label: str) -> int | None:
    """The log's schema version; None for a database with no tables at all."""
    names = set(inspect(conn).get_table_names())
    if not names:
        return None
    if "schema_version" not in names:
        raise LogError(f"{label}: not a deepserve log (no schema_version table)")
    version = conn.execute(select(func.max(schema_version.c.version))).scalar()
    if version is None:
        raise LogError(f"{label}: not a deepserve log (its schema_version table is empty)")
    if version > SCHEMA_VERSION:
        raise LogError(
            f"{label}: log schema version {version} is newer than this deepserve supports "
            f"({SCHEMA_VERSION}); upgrade deepserve to read it"
        )
    missing = [t for t in TABLES if t not in names]
    if missing and version == SCHEMA_VERSION:
        raise LogError(f"{label}: damaged log: missing table(s) {', '.join(missing)}")
    return version


def ensure_schema(conn: Connection, label: str, *, create: bool, upgrade: bool) -> tuple[int, int]:
    """Make `conn`'s database a current-version log. Returns (version found, version now);
    a new log counts as found at the current version. Run inside a transaction."""
    if conn.dialect.name == "postgresql":
        conn.execute(select(func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK)))
    version = stored_version(conn, label)
    if version is None:
        if not create:
            raise LogError(f"{label}: not a deepserve log (the database has no tables)")
        metadata.create_all(conn)
        _record(conn, SCHEMA_VERSION)
        return SCHEMA_VERSION, SCHEMA_VERSION
    if version < SCHEMA_VERSION and not upgrade:
        raise LogError(
            f"{label}: log schema version {version} is older than {SCHEMA_VERSION}; "
            "migrate it first (deepserve replay migrate LOG)"
        )
    for v in range(version, SCHEMA_VERSION):
        step = MIGRATIONS.get(v)
        if step is None:
            raise LogError(f"{label}: no migration from schema version {v} to {v + 1}")
        step(conn)
        _record(conn, v + 1)
    return version, SCHEMA_VERSION


def _record(conn: Connection, version: int) -> None:
    conn.execute(insert(schema_version).values(version=version, applied_at=time.time()))
