"""Queries of the running daemon's event logs for the admin API: SQLAlchemy's async engine on
aiosqlite, so a read never blocks the event loop, and the same query runs on PostgreSQL by URL.

A run directory holds one log per process: `daemon.db` (the main process) and, in processes mode,
one per TE process and generation (`te-1-g2.db`). A request's story spans them (the JE in the
main process, its tasks in the TE processes), so a query reads every log of the run directory,
including the logs of processes that have died, and merges the rows by time (the processes of a
run share one epoch, so their clocks compare). Each log is written by its own process in WAL mode;
these reads see what has committed (up to the writer's flush window, 0.25 s, behind the live state).

A log's runs are in pages (the thread writer's default layout, `persistence/sqlite/page_store.py`)
or rows (older logs, `layout="rows"`, PostgreSQL): each query reads both. Pages carry no index by
correlation id: a timeline decodes the head of every page's inputs (a page in full only when one of
its inputs matches), in a worker thread so that the event loop keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from deepserve.core.records import Step
from deepserve.persistence.errors import LogError
from deepserve.persistence.pages import select_in_page
from deepserve.persistence.schema import events, inputs, pages

MAX_ROWS = 1000  # a limit on everything
MAX_LOGS = 4096  # logs of one run directory read by one query
PAGE_CHUNK = 64  # pages fetched (and decoded in a worker thread) at a time
ADMIN_SOURCES = ("ext/admin", "ext/operator")


def read_only_url(path: Path) -> str:
    """An aiosqlite URL that opens `path` read-only (another process writes it)."""
    return f"sqlite+aiosqlite:///file:{path.resolve()}?mode=ro&uri=true"


class LogQueries:
    """`sources()` names the logs to read: (label, URL) pairs; an engine per URL, kept."""

    def __init__(self, sources: Callable[[], list[tuple[str, str]]]) -> None:
        self.sources = sources
        self.engines: dict[str, AsyncEngine] = {}

    @classmethod
    def for_sqlite(cls, path: str) -> LogQueries:
        return cls(lambda: [(Path(path).stem, read_only_url(Path(path)))])

    @classmethod
    def for_run_dir(cls, run_dir: Path, main_log: Path) -> LogQueries:
        """The main log first, then every other `*.db` of the run directory, by name."""
        def sources() -> list[tuple[str, str]]:
            others = sorted(p for p in run_dir.glob("*.db") if p != main_log)[: MAX_LOGS - 1]
            return [(p.stem, read_only_url(p)) for p in (main_log, *others)]
        return cls(sources)

    async def close(self) -> None:
        for engine in self.engines.values():
            await engine.dispose()
        self.engines.clear()

    def _engine(self, url: str) -> AsyncEngine:
        engine = self.engines.get(url)
        if engine is None:
            # No pool: a query opens and closes its connection, so the logs of processes that
            # are gone hold no file handle or thread here.
            engine = self.engines[url] = create_async_engine(url, poolclass=NullPool)
        return engine

    async def request_timeline(self, request_id: str, limit: int = MAX_ROWS) -> tuple[list[dict[str, Any]], bool]:
        """The first `limit` steps whose input carries the request id (its correlation id), with
        the events each recorded, from every log, by time (then log, then log order); and
        whether there were more (a long request has a step per forward pass)."""
        limit = max(1, min(limit, MAX_ROWS))
        rows: list[tuple[float, int, int, dict[str, Any]]] = []
        for n, (label, url) in enumerate(self.sources()):
            try:
                found = await self._timeline_in(url, request_id, limit + 1)
            except (SQLAlchemyError, LogError):
                continue  # a process's log not created yet (or not yet a log, or damaged): nothing of it to show
            rows += [(r["t"], n, i, {**r, "process": label}) for i, r in enumerate(found)]
        rows.sort(key=lambda r: r[:3])
        return [r[3] for r in rows[:limit]], len(rows) > limit

    async def _timeline_in(self, url: str, request_id: str, limit: int) -> list[dict[str, Any]]:
        q = (select(inputs.c.id, inputs.c.t.label("at"), inputs.c.actor, inputs.c.src, inputs.c.type, inputs.c.external)
             .where(inputs.c.corr == request_id).order_by(inputs.c.id).limit(limit))  # fmt: skip
        async with self._engine(url).connect() as conn:
            steps = (await conn.execute(q)).all()
            ids = [s.id for s in steps]
            evs = (await conn.execute(select(events.c.step_id, events.c.type).where(events.c.step_id.in_(ids))
                                      .order_by(events.c.id))).all() if ids else []  # fmt: skip
            paged = await self._paged(conn, url, lambda i: i.corr == request_id, limit, newest_first=False)
        by_step: dict[int, list[str]] = {}
        for e in evs:
            by_step.setdefault(e.step_id, []).append(e.type)
        found = [(s.id, {"t": s.at, "actor": s.actor, "from": s.src, "input": s.type, "external": bool(s.external),
                         "events": by_step.get(s.id, [])}) for s in steps]  # fmt: skip
        found += [(sid, {"t": st.input.t, "actor": st.input.actor, "from": st.input.src, "input": st.input.type,
                         "external": bool(st.input.external), "events": [e.type for e in st.events]})
                  for sid, st in paged]  # fmt: skip
        found.sort(key=lambda f: f[0])  # log order (rows and pages share the step ids)
        return [f[1] for f in found[:limit]]

    async def _paged(self, conn: Any, url: str, keep: Callable[[Any], bool], limit: int,
                     newest_first: bool) -> list[tuple[int, Step]]:  # fmt: skip
        """Up to `limit` steps of the log's pages whose input `keep` selects, with their step ids,
        in log order (or newest first)."""
        c = pages.c
        q = select(c.id, c.run_id, c.first_step, c.body, c.crc32).order_by(c.id.desc() if newest_first else c.id)
        found: list[tuple[int, Step]] = []
        result = await conn.stream(q)
        try:
            async for chunk in result.partitions(PAGE_CHUNK):
                found += await asyncio.to_thread(_select, url, chunk, keep, newest_first)
                if len(found) >= limit:
                    break
        finally:
            await result.close()
        return found[:limit]

    async def recent_admin_inputs(self, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
        """The latest admin actions (faults, operator inputs), newest first (the main log's:
        admin inputs enter the run in the main process)."""
        limit = max(1, min(limit, MAX_ROWS))
        q = (select(inputs.c.id, inputs.c.t.label("at"), inputs.c.actor, inputs.c.src, inputs.c.type)
             .where(inputs.c.src.in_(ADMIN_SOURCES), inputs.c.type != "Started")  # not the boot
             .order_by(inputs.c.id.desc()).limit(limit))  # fmt: skip
        _, url = self.sources()[0]
        async with self._engine(url).connect() as conn:
            rows = (await conn.execute(q)).all()
            # an admin input's head shows its source; its type (not the boot's Started) is read after
            paged = await self._paged(conn, url, lambda i: i.src in ADMIN_SOURCES, limit + 1, newest_first=True)
        found = [(r.id, {"t": r.at, "to": r.actor, "from": r.src, "input": r.type}) for r in rows]
        found += [(sid, {"t": st.input.t, "to": st.input.actor, "from": st.input.src, "input": st.input.type})
                  for sid, st in paged if st.input.type != "Started"]  # fmt: skip
        found.sort(key=lambda f: f[0], reverse=True)
        return [f[1] for f in found[:limit]]


def _select(label: str, chunk: Sequence[Any], keep: Callable[[Any], bool], newest_first: bool) -> list[tuple[int, Step]]:
    """The selected steps of a chunk of page rows (id, run id, first step, body, crc32), with their
    step ids (a damaged page raises `LogError`, which the caller reports)."""
    out: list[tuple[int, Step]] = []
    for page_id, run_id, first, body, crc in chunk:
        hits = [(first + i, step) for i, step in select_in_page(label, run_id, (page_id, body, crc), keep)]
        out += reversed(hits) if newest_first else hits
    return out
