"""The event store: schema, group-commit writer, streaming readers, snapshots.

SQLite by default (a file path, or a directory of per-process files), PostgreSQL by
URL. `open_sink` gives the process's writer, `open_log` a reader, `migrate` upgrades
an old log's schema explicitly.
"""

from .api import Durability, DurableSink, LogError, LogReader, MemoryLog, MemoryStore
from .factory import migrate, open_log, open_sink
from .procsink import ProcessSink
from .schema import SCHEMA_VERSION
from .writer import GroupCommitSink

__all__ = [
    "SCHEMA_VERSION",
    "DurableSink",
    "Durability",
    "GroupCommitSink",
    "LogError",
    "LogReader",
    "MemoryLog",
    "MemoryStore",
    "ProcessSink",
    "migrate",
    "open_log",
    "open_sink",
]
