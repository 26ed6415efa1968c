"""The event store's schema (SQLAlchemy Core): one definition for SQLite and PostgreSQL.

Columns are named exactly like the fields of the kernel's record structs, so a row is
`(prefix..., *astuple(record))` and a record is `Rec(*row[len(prefix):])`. The columns
are spelled out (not derived from the structs) on purpose: a new record field must
come with a schema version and a migration, and `check_columns` fails loudly until it
does.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    false,
)

from deepserve.core.records import EventRec, InputRec, OutputRec, RunRec, SnapshotRec

# v1: the first release. v2: `runs.process` (one run spans several processes in daemon
# mode; v1 logs were single-process and read back as process "main"). v3: `inputs.ask`
# and `inputs.src_hlc`. v4: `pages` (a run's steps as encoded pages: the writer process).
# v5: `crc32` on every row of the row layout and on `runs` (rows.py: what a row holds is
# checked on every read, as pages' bodies are). v6: a page's body may be a zstd frame of its
# msgpack (pages.py; the writer process compresses every page it stores): nothing else changed,
# but a deepserve before v6 would take such a page for a damaged one. v7: `run_ends`, the
# closing record a writer stores when it closes its log cleanly (run_ends.py).
SCHEMA_VERSION = 7

# SQLite only makes INTEGER PRIMARY KEY an alias of the rowid (no extra b-tree);
# PostgreSQL needs 64 bits for long-lived cluster databases.
_ID = BigInteger().with_variant(Integer, "sqlite")

metadata = MetaData()


def _id() -> Column:
    # Insertion order: log order is append order within a process.
    return Column("id", _ID, primary_key=True, autoincrement=True)


def _text(name: str, nullable: bool = False) -> Column:
    return Column(name, Text, nullable=nullable)


def _int(name: str, nullable: bool = False) -> Column:
    return Column(name, BigInteger, nullable=nullable)


def _crc() -> Column:
    # v5: zlib.crc32 of the row's record values (rows.row_crc); 0 only until a v4 log's
    # migration has summed its rows
    return Column("crc32", BigInteger, nullable=False, server_default="0")


schema_version = Table(
    "schema_version",
    metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("applied_at", Double, nullable=False),
)

runs = Table(
    "runs",
    metadata,
    _id(),
    _text("run_id"),
    _text("mode"),
    _int("seed"),
    _text("config"),
    _text("code_version"),
    _text("host"),
    Column("started_at", Double, nullable=False),
    Column("process", Text, nullable=False, server_default="main"),
    _crc(),  # v5
)

inputs = Table(
    "inputs",
    metadata,
    _id(),  # doubles as the step id that events/outputs/snapshots point to
    _text("run_id"),
    _text("actor"),
    _int("seq"),
    Column("t", Double, nullable=False),
    _int("hlc"),
    Column("kind", Integer, nullable=False),
    _text("src"),
    _int("msg_id"),
    _text("corr", nullable=True),
    _int("reply_to", nullable=True),
    Column("external", Boolean, nullable=False),
    _text("type"),
    Column("payload", LargeBinary, nullable=False),
    Column("ask", Boolean, nullable=False, server_default=false()),  # v3
    Column("src_hlc", BigInteger, nullable=False, server_default="0"),  # v3
    _crc(),  # v5
)
# Every reader query is scoped to one run; leading with run_id lets the SQLite planner
# pick these without ANALYZE statistics.
Index("ix_inputs_actor", inputs.c.run_id, inputs.c.actor, inputs.c.seq)
Index("ix_inputs_corr", inputs.c.run_id, inputs.c.corr)
Index("ix_inputs_t", inputs.c.run_id, inputs.c.t)

events = Table(
    "events",
    metadata,
    _id(),
    _int("step_id"),
    _text("run_id"),
    _text("actor"),
    _int("seq"),
    Column("idx", Integer, nullable=False),
    _text("type"),
    Column("payload", LargeBinary, nullable=False),
    _crc(),  # v5
)
Index("ix_events_step", events.c.step_id)

outputs = Table(
    "outputs",
    metadata,
    _id(),
    _int("step_id"),
    _text("run_id"),
    _text("actor"),
    _int("seq"),
    Column("idx", Integer, nullable=False),
    Column("kind", Integer, nullable=False),
    _text("dst"),
    _int("msg_id"),
    Column("delay", Double, nullable=False),
    _text("key", nullable=True),
    _text("corr", nullable=True),
    _int("reply_to", nullable=True),
    Column("ask", Boolean, nullable=False),
    _text("type"),
    Column("payload", LargeBinary, nullable=False),
    _crc(),  # v5
)
Index("ix_outputs_step", outputs.c.step_id)

snapshots = Table(
    "snapshots",
    metadata,
    _id(),
    _int("step_id"),
    _text("run_id"),
    _text("actor"),
    _int("seq"),
    _text("type"),
    Column("payload", LargeBinary, nullable=False),
    _crc(),  # v5
)
Index("ix_snapshots_step", snapshots.c.step_id)
Index("ix_snapshots_actor", snapshots.c.run_id, snapshots.c.actor, snapshots.c.seq)

# v4. The paged layout: a run written by the writer process (`sqlite/process_writer.py`,
# simulations) keeps its steps here, `steps` at a time, each page the msgpack `list[Step]`
# the driver encoded (`pages.py`), instead of a row per record in the four tables above.
# Inserting a row costs the writer ~3-8 µs on this class of machine; a page of ~1,000
# steps costs about as much as one row, and reading it back is one msgspec decode. Its
# steps have the ids first_step .. first_step + steps - 1, from the same sequence as
# `inputs.id`. A run is in one layout or the other, never both.
pages = Table(
    "pages",
    metadata,
    _id(),
    _text("run_id"),
    _int("first_step"),
    Column("steps", Integer, nullable=False),
    Column("t_first", Double, nullable=False),  # the least and greatest input clock time:
    Column("t_last", Double, nullable=False),  # `since`/`until` skip pages without decoding
    Column("body", LargeBinary, nullable=False),
    # zlib.crc32 of `body`: SQLite checks its own structures, not what a blob holds, and a
    # damaged page can still decode into other steps. Checked on every read of a page.
    _int("crc32"),
)
Index("ix_pages_run", pages.c.run_id, pages.c.id)

# v7. A run's end, as its writer (one per process) recorded it when it closed the log cleanly:
# how many steps it stored, in how many units (input rows, or pages), and the running digest of
# those units' CRC-32s (`rows.RunningDigest`). A log whose last steps are gone is told from a
# whole one by it, and a run with no closing record was not closed (its process died, or still
# writes). `steps` is -1 (`rows.LEGACY_END`) for a run the v6 -> v7 migration found: written
# before closing records existed, its end cannot be checked.
run_ends = Table(
    "run_ends",
    metadata,
    _id(),
    _text("run_id"),
    _text("process"),
    _int("steps"),
    _int("units"),
    _text("digest"),
    Column("ended_at", Double, nullable=False),  # wall clock, excluded from digests
    _int("crc32"),
)
Index("ix_run_ends_run", run_ends.c.run_id, run_ends.c.process)

TABLES = ("schema_version", "runs", "inputs", "events", "outputs", "snapshots", "pages", "run_ends")
RUN_END_FIELDS = ("run_id", "process", "steps", "units", "digest", "ended_at")

# Field lists: the record part of each row, in struct order.
RUN_FIELDS: tuple[str, ...] = RunRec.__struct_fields__
INPUT_FIELDS: tuple[str, ...] = InputRec.__struct_fields__
EVENT_FIELDS: tuple[str, ...] = EventRec.__struct_fields__
OUTPUT_FIELDS: tuple[str, ...] = OutputRec.__struct_fields__
SNAPSHOT_FIELDS: tuple[str, ...] = SnapshotRec.__struct_fields__

# Columns written by the hot path, in row-tuple order.
INSERT_COLUMNS: dict[str, tuple[str, ...]] = {
    "runs": (*RUN_FIELDS, "crc32"),
    "inputs": ("id", "run_id", *INPUT_FIELDS, "crc32"),
    "events": ("step_id", "run_id", *EVENT_FIELDS, "crc32"),
    "outputs": ("step_id", "run_id", *OUTPUT_FIELDS, "crc32"),
    "snapshots": ("step_id", "run_id", *SNAPSHOT_FIELDS, "crc32"),
    "pages": ("run_id", "first_step", "steps", "t_first", "t_last", "body", "crc32"),
    "run_ends": (*RUN_END_FIELDS, "crc32"),
}


def check_columns() -> list[str]:
    """Record fields with no column: non-empty means the kernel's records changed
    and the schema needs a new version and a migration."""
    missing = []
    for name, cols in INSERT_COLUMNS.items():
        table = metadata.tables[name]
        missing += [f"{name}.{c}" for c in cols if c not in table.c]
    return missing
