"""The store interface every backend implements (in-memory, SQLite, PostgreSQL).

Writers are `LogSink`s (see `core.records`): drivers append `Step`s without
blocking. Readers stream `Step`s in log order and never load a whole log.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, Protocol

from deepserve.core.records import DurableSink, LogSink, MemorySink, RunRec, SnapshotRec, Step

Durability = Literal["async", "outbox"]
__all__ = ["DurableSink", "Durability", "LogError", "LogReader", "LogSink", "MemoryLog", "MemoryStore"]


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


class MemoryStore(MemorySink):
    """A `MemorySink` that also remembers which run each step belongs to (so one store
    can hold several runs, like a database) and speaks the `DurableSink` protocol:
    a step is committed as soon as it is appended."""

    def __init__(self) -> None:
        super().__init__()
        self.step_runs: list[str] = []  # parallel to `steps`
        self.on_commit: Callable[[int], None] | None = None

    def append(self, step: Step) -> int:
        if not self.runs:
            raise LogError("memory: append() before begin_run()")
        self.step_runs.append(self.runs[-1].run_id)
        ticket = super().append(step)
        if self.on_commit is not None:
            self.on_commit(ticket)
        return ticket

    @property
    def committed_ticket(self) -> int:
        return len(self.steps)


class MemoryLog:
    """`LogReader` over a `MemorySink` — the in-memory backend. Over a plain
    `MemorySink` every step belongs to every run (it records no association); over a
    `MemoryStore`, `run_id=None` means the last run begun, as in the SQL backends."""

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    def runs(self) -> list[RunRec]:
        return list(self.sink.runs)

    def _check_run(self, run_id: str | None) -> None:
        if run_id is not None and all(r.run_id != run_id for r in self.sink.runs):
            raise LogError(f"no run {run_id!r} in this log")

    def _in_run(self, run_id: str | None) -> Iterator[Step]:
        self._check_run(run_id)
        step_runs = getattr(self.sink, "step_runs", None)
        if step_runs is None:
            yield from self.sink.steps
            return
        if run_id is None:
            if not self.sink.runs:
                return
            run_id = self.sink.runs[-1].run_id
        for run, step in zip(step_runs, self.sink.steps, strict=True):
            if run == run_id:
                yield step

    def actors(self, run_id: str | None = None) -> list[str]:
        return sorted({s.input.actor for s in self._in_run(run_id) if s.input.seq >= 0})

    def steps(
        self,
        run_id: str | None = None,
        *,
        actor: str | None = None,
        corr: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Iterator[Step]:
        for s in self._in_run(run_id):
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
        for s in self._in_run(run_id):
            if s.snapshot is not None and (actor is None or s.snapshot.actor == actor):
                yield s.snapshot

    def close(self) -> None:
        return None
