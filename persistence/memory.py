"""The in-memory backend: `MemoryStore` (a sink that knows runs, like a database)
and `MemoryLog` (the `LogReader` over any `MemorySink`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from deepserve.core.records import MemorySink, RunRec, SnapshotRec, Step

from .api import LogReader, SinkStatistics, StepFilter
from .errors import LogError, RunExists


class MemoryStore(MemorySink):
    """A `MemorySink` that also remembers which run each step belongs to (so one store
    can hold several runs, like a database) and speaks the `DurableSink` protocol:
    a step is committed as soon as it is appended."""

    def __init__(self) -> None:
        super().__init__()
        self.step_runs: list[str] = []  # parallel to `steps`
        self.on_commit: Callable[[int], None] | None = None

    def begin_run(self, run: RunRec) -> None:
        if any((r.run_id, r.process) == (run.run_id, run.process) for r in self.runs):
            raise RunExists("memory", run.run_id, run.process)
        super().begin_run(run)

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

    # the `PressureSink` protocol: memory is never behind
    under_pressure = False

    async def wait_for_room(self) -> None:
        return None

    def statistics(self) -> SinkStatistics:
        n = len(self.steps)
        return SinkStatistics(n, n, 0, 0, 1, 0, 1, n, 0, 0.0)


class MemoryLog(LogReader):
    """`LogReader` over a `MemorySink`. Over a plain `MemorySink` every step belongs
    to every run (it records no association); over a `MemoryStore`, `run_id=None`
    means the last run begun, as in the SQL backends."""

    label = "memory"

    def __init__(self, sink: MemorySink) -> None:
        self.sink = sink

    def runs(self) -> list[RunRec]:
        return list(self.sink.runs)

    def _in_run(self, run_id: str | None) -> Iterator[Step]:
        if run_id is not None and all(r.run_id != run_id for r in self.sink.runs):
            raise LogError(f"no run {run_id!r} in this log")
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

    def read_steps(self, run_id: str | None, where: StepFilter) -> Iterator[Step]:
        if where.whole_run:
            return self._in_run(run_id)
        return (s for s in self._in_run(run_id) if where.matches(s.input))

    def snapshots(self, run_id: str | None = None, actor: str | None = None) -> Iterator[SnapshotRec]:
        for s in self._in_run(run_id):
            if s.snapshot is not None and (actor is None or s.snapshot.actor == actor):
                yield s.snapshot
