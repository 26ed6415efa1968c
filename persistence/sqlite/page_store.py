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
from typing import Any

import msgspec
import zstandard

from deepserve.core.records import Step

from ..pages import page_body
from ..rows import RunningDigest
from .fresh import INSERT_PAGE, INSERT_RUN, INSERT_RUN_END, RUN_COLUMNS
from .sql import MultiInsert, transaction
from .thread_store import SqliteThreadStore

PAGE_ZSTD_LEVEL = 3


class SqlitePageStore(SqliteThreadStore):
    """The paged layout: each transaction's steps of a run as one page."""

    def __init__(self, path: str, durability: str, synchronous: str | None = None,
                 cache_kib: int | None = None) -> None:  # fmt: skip
        super().__init__(path, durability, synchronous, cache_kib)
        self.runs = MultiInsert(INSERT_RUN, RUN_COLUMNS, self.max_vars)
        self._encode = msgspec.msgpack.Encoder().encode
        self._compress = zstandard.ZstdCompressor(level=PAGE_ZSTD_LEVEL).compress

    def _insert_run(self, c: sqlite3.Connection, row: list[Any]) -> None:
        self.runs.run_flat(c, row)

    def _insert_steps(self, c: sqlite3.Connection, run_id: str, first: int, part: list[Step],
                      sums: RunningDigest) -> None:  # fmt: skip
        raw, head = page_body(part, self._encode)  # (steps the driver encoded itself included)
        body = self._compress(raw)
        crc = zlib.crc32(body)
        c.execute(INSERT_PAGE, (run_id, first, head.steps, head.t_first, head.t_last, body, crc))
        sums.add((crc,), head.steps)

    def end_runs(self) -> None:
        """The closing record of every run this store wrote, in one transaction (`GroupCommitSink`
        calls it once everything appended is committed and the sink closes cleanly)."""
        rows = [d.end_row(run_id, process) for (run_id, process), d in self.ends.items()]
        if rows:
            transaction(self.conn, lambda c: c.executemany(INSERT_RUN_END, rows))
