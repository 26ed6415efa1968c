"""The store interface every backend implements (in-memory, SQLite, PostgreSQL).

Writers are `LogSink`s (see `core.records`): drivers append `Step`s without
blocking. Readers stream `Step`s in log order and never load a whole log.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol

from deepserve.core.records import MemorySink, RunRec, SnapshotRec, Step

Durability = Literal["async", "outbox"]


class LogError(Exception):
    """A log that cannot be read: corrupt, truncated, wrong schema version.
    The message is one precise line meant for the user."""


class LogReader(Protocol):
    def runs(self) -> list[RunRec]: ...

    def actors(self, run_id: str | None = None) -> list[str]: ...

    def steps(
        self,
        run_id: str | None = None,
        *,
        actor: str | None = None,
        corr: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Step]:
        """Steps of one run (default: the only/last run) in log order; filters
        select by input actor, correlation id and input clock time [since, until]."""
        ...

    def snapshots(self, run_id: str | None = None, actor: str | None = None) -> Iterator[SnapshotRec]: ...

    def close(self) -> None: ...


class MemoryLog:
    """`LogReader` over a `MemorySink` — the in-memory backend."""

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    def runs(self) -> list[RunRec]:
        return list(self.sink.runs)

    def _check_run(self, run_id: str | None) -> None:
        if run_id is not None and all(r.run_id != run_id for r in self.sink.runs):
            raise LogError(f"no run {run_id!r} in this log")

    def actors(self, run_id: str | None = None) -> list[str]:
        self._check_run(run_id)
        return sorted({s.input.actor for s in self.sink.steps if s.input.seq >= 0})

    def steps(
        self,
        run_id: str | None = None,
        *,
        actor: str | None = None,
        corr: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Step]:
        self._check_run(run_id)
        for s in self.sink.steps:
            i = s.input
            if actor is not None and i.actor != actor:
                continue
            if corr is not None and i.corr != corr:
                continue
            if since is not None and i.t < since:
                continue
            if until is not None and i.t > until:
                continue
            yield s

    def snapshots(self, run_id: str | None = None, actor: str | None = None) -> Iterator[SnapshotRec]:
        self._check_run(run_id)
        for s in self.sink.steps:
            if s.snapshot is not None and (actor is None or s.snapshot.actor == actor):
                yield s.snapshot

    def close(self) -> None:
        return None
