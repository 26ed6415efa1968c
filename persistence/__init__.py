"""The event store: a log of `Step`s in SQLite (a file, or a directory of per-process
files) or PostgreSQL (a URL). `open_sink` gives the process's writer, `open_log` a
reader, `migrate` upgrades an old log's schema explicitly.

How a step goes from a handler to a row and back:

    handler → ctx.record / ctx.send ...           core/context.py, core/cell.py
      → Step(input, events, outputs, snapshot)    core/records.py: one per delivery
      → sink.append(step) → ticket                a LogSink, from open_sink (factory.py):
          GroupCommitSink  group_commit.py        a queue and a writer thread, one batch a
            └ BatchStore.write(batch)             transaction: sqlite/page_store.py (one
                                                  zstd page, the default), batch_store.py
                                                  (layout="rows") or postgres.py
          ProcessSink      sqlite/process_writer.py  batches msgpack-encoded to a child
            └ child.py "write"                    process that stores each as one page
                                                  (pages.py: simulations, no rows)
      → rows.step_rows(steps, run, step ids)      THE row builder: [step id, run id,
                                                  *fields, crc32] per record, one list a table
      → INSERT (sqlite/sql.py) or COPY            tables: schema.py (columns = fields)
    and back:
    open_log(target) → LogReader (api.py)         .steps(run, actor=, corr=, since=, until=)
      → read_steps(run, StepFilter)               THE filter (api.py); SQL: sql_reader.py
                                                  (a paged run: pages.page_steps, one
                                                  decode a page, then the filter)
      → rows ending with (crc32, step id)         sqlite/sql.read_steps (plain sqlite3, in
                                                  this process or child.py "read"), or
                                                  SqlLog (SQLAlchemy, PostgreSQL)
      → rows.group_steps(ins, evs, outs, snaps)   THE step assembly: each row checked
                                                  against its crc32, then step tuples
      → msgspec.convert / decode → list[Step]     sql_reader.to_steps, process_reader.py

Files: `api` (interfaces, `StepFilter`), `errors` (`LogError`, `one_line`), `memory`
(the in-memory backend), `target` (parsing a target), `factory` (opening), `schema`
and `versions` (tables; schema versions, migrations), `rows` (builder and assembly),
`pages` (the paged layout), `open_sinks` (sinks closed at exit, failures reported), `group_commit`
(the thread writer), `sql_reader` and `merged_reader` (readers), `postgres`, and the
SQLite backend in `sqlite/`: `files` (checks, schema setup, the reader's database),
`sql` (statements), `batch_store`, `log_reader`, `child` (everything that runs in a
child process: framing, spawning, the writer and reader loops) and its parents'
sides `process_writer` and `process_reader`.

Exports load on first use (PEP 562): a child process imports `deepserve.persistence
.sqlite.child`, which must not pay for SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.lazy import lazy_exports

if TYPE_CHECKING:
    from .api import Durability, DurableSink, LogReader, PressureSink, SinkStatistics, StepFilter
    from .errors import LogError
    from .factory import migrate, open_log, open_sink
    from .group_commit import GroupCommitSink
    from .memory import MemoryLog, MemoryStore
    from .open_sinks import close_failures, close_open_sinks
    from .schema import SCHEMA_VERSION
    from .sqlite.process_writer import ProcessSink

_EXPORTS = {
    "Durability": ".api",
    "DurableSink": ".api",
    "LogReader": ".api",
    "PressureSink": ".api",
    "SinkStatistics": ".api",
    "StepFilter": ".api",
    "LogError": ".errors",
    "migrate": ".factory",
    "open_log": ".factory",
    "open_sink": ".factory",
    "GroupCommitSink": ".group_commit",
    "MemoryLog": ".memory",
    "MemoryStore": ".memory",
    "SCHEMA_VERSION": ".schema",
    "close_failures": ".open_sinks",
    "close_open_sinks": ".open_sinks",
    "ProcessSink": ".sqlite.process_writer",
}


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())


__all__ = [
    "SCHEMA_VERSION",
    "DurableSink",
    "Durability",
    "GroupCommitSink",
    "LogError",
    "LogReader",
    "MemoryLog",
    "MemoryStore",
    "PressureSink",
    "ProcessSink",
    "SinkStatistics",
    "StepFilter",
    "close_failures",
    "close_open_sinks",
    "migrate",
    "open_log",
    "open_sink",
]
