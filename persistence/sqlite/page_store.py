"""The thread writer's paged layout (`open_sink(..., layout="pages")`, the SQLite default): each
transaction's steps stored as one page, a zstd frame of their msgpack `list[Step]`, as the writer
process stores a simulation's (`pages.py`, `child.PageWriter`); the readers are the same.

Why: a daemon's log in rows was ~28 KB per served request (issue 30): ~12 rows per forward pass,
~100-150 bytes each plus three indexes on `inputs`. A daemon's records repeat the same addresses,
type names and payload shapes, which zstd folds away; a page also needs no per-record index.
What it gives up is the per-record index (a correlation-id filter decodes the run's page heads:
`pages.page_steps`) — the admin timeline reads pages the same way (`daemon/logquery.py`).

A page is one transaction, so what is committed and when is exactly as in the row layout: `outbox`
still releases a delivery's outputs once its page commits, and `async` loses at most what the
writer had not committed (the linger window, `group_commit.py`). Pages of a daemon are small (a
linger window's steps, ~tens): zstd level 3 packs them ~1.5x tighter than the writer process's
level -1 at a cost the writer thread barely sees at a daemon's rate (measured, docs/decisions.md).
"""

from __future__ import annotations

import sqlite3
import zlib
from collections.abc import Sequence

import msgspec
import zstandard
from msgspec.structs import astuple

from deepserve.core.records import RunRec, Step

from ..errors import RunExists
from ..group_commit import runs_and_steps
from ..pages import page_head
from ..rows import RunningDigest, run_row
from .checks import BUSY_MS
from .fresh import INSERT_PAGE, INSERT_RUN, INSERT_RUN_END, RUN_COLUMNS, max_id_sql, writer_pragmas
from .sql import RUN_EXISTS, MultiInsert, transaction

PAGE_ZSTD_LEVEL = 3


class SqlitePageStore:
    """Writes one batch per transaction, its steps as one page. Lives in the writer thread."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None,
                 cache_kib: int | None = None) -> None:  # fmt: skip
        self.label = path
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_MS / 1000)
        for pragma in writer_pragmas(durability, synchronous, cache_kib):
            self.conn.execute(f"PRAGMA {pragma}")
        max_vars = self.conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        self.runs = MultiInsert(INSERT_RUN, RUN_COLUMNS, max_vars)
        self.max_id = max_id_sql()
        self.run_id: str | None = None
        self.process = ""
        self.ends: dict[tuple[str, str], RunningDigest] = {}
        self._encode = msgspec.msgpack.Encoder().encode
        self._compress = zstandard.ZstdCompressor(level=PAGE_ZSTD_LEVEL).compress

    def write(self, items: Sequence[Step | RunRec]) -> int:
        """Commit `items` in one transaction; returns the number of steps written."""
        steps, (self.run_id, self.process) = transaction(self.conn, lambda c: self._write(c, items))
        return steps

    def _write(
        self, c: sqlite3.Connection, items: Sequence[Step | RunRec]
    ) -> tuple[int, tuple[str | None, str]]:
        run_id, process = self.run_id, self.process
        written = 0
        for part in runs_and_steps(items):
            if isinstance(part, RunRec):
                if c.execute(RUN_EXISTS, (part.run_id, part.process)).fetchone() is not None:
                    raise RunExists(self.label, part.run_id, part.process)
                self.runs.run_flat(c, run_row(astuple(part)))
                run_id, process = part.run_id, part.process
                self.ends[(run_id, process)] = RunningDigest()
                continue
            if run_id is None:
                raise ValueError("a step was appended before begin_run()")
            # Step ids are assigned under the write lock, as in `SqliteBatchStore`.
            first = (c.execute(self.max_id).fetchone()[0] or 0) + 1
            head = page_head(part)
            body = self._compress(self._encode(part))
            crc = zlib.crc32(body)
            c.execute(INSERT_PAGE, (run_id, first, head.steps, head.t_first, head.t_last, body, crc))
            # a failed transaction fails the sink, which then writes no closing record at all
            self.ends[(run_id, process)].add((crc,), len(part))
            written += len(part)
        return written, (run_id, process)  # the run switches once committed

    def end_runs(self) -> None:
        """The closing record of every run this store wrote, in one transaction (`GroupCommitSink`
        calls it once everything appended is committed and the sink closes cleanly)."""
        rows = [d.end_row(run_id, process) for (run_id, process), d in self.ends.items()]
        if rows:
            transaction(self.conn, lambda c: c.executemany(INSERT_RUN_END, rows))

    def close(self) -> None:
        self.conn.close()
