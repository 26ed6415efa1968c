"""Queries of the running daemon's event log for the admin API: SQLAlchemy's async engine on
aiosqlite, so a read never blocks the event loop, and the same query runs on PostgreSQL by URL.

The log is written by the sink's thread in WAL mode; these reads see what has committed (a few
milliseconds behind the live state)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from deepserve.persistence.schema import events, inputs

MAX_ROWS = 1000  # a limit on everything


class LogQueries:
    def __init__(self, url: str) -> None:
        self.engine: AsyncEngine = create_async_engine(url)

    @classmethod
    def for_sqlite(cls, path: str) -> LogQueries:
        return cls(f"sqlite+aiosqlite:///{path}")

    async def close(self) -> None:
        await self.engine.dispose()

    async def request_timeline(self, request_id: str, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
        """Every step whose input carries the request id (its correlation id), with the events
        the step recorded, in log order."""
        limit = max(1, min(limit, MAX_ROWS))
        q = (select(inputs.c.id, inputs.c.t.label("at"), inputs.c.actor, inputs.c.src, inputs.c.type, inputs.c.external)
             .where(inputs.c.corr == request_id).order_by(inputs.c.id).limit(limit))  # fmt: skip
        async with self.engine.connect() as conn:
            steps = (await conn.execute(q)).all()
            ids = [s.id for s in steps]
            evs = (await conn.execute(select(events.c.step_id, events.c.type).where(events.c.step_id.in_(ids))
                                      .order_by(events.c.id))).all() if ids else []  # fmt: skip
        by_step: dict[int, list[str]] = {}
        for e in evs:
            by_step.setdefault(e.step_id, []).append(e.type)
        return [{"t": s.at, "actor": s.actor, "from": s.src, "input": s.type, "external": bool(s.external),
                 "events": by_step.get(s.id, [])} for s in steps]  # fmt: skip

    async def recent_admin_inputs(self, limit: int = 50) -> list[dict[str, Any]]:
        """The latest admin actions (faults, operator inputs), newest first."""
        limit = max(1, min(limit, MAX_ROWS))
        q = (select(inputs.c.t.label("at"), inputs.c.actor, inputs.c.src, inputs.c.type)
             .where(inputs.c.src.in_(("ext/admin", "ext/operator"))).order_by(inputs.c.id.desc()).limit(limit))  # fmt: skip
        async with self.engine.connect() as conn:
            rows = (await conn.execute(q)).all()
        return [{"t": r.at, "to": r.actor, "from": r.src, "input": r.type} for r in rows]
