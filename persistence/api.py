"""The store interface every backend implements (in-memory, SQLite, PostgreSQL).

Writers are `LogSink`s (see `core.records`): drivers append `Step`s without
blocking. Readers are `LogReader`s: they stream `Step`s in log order and never load
a whole log. The step filter is spelled once, here: `LogReader.steps` takes it as
keywords and hands a backend one `StepFilter`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Literal, NamedTuple, Protocol

import msgspec

from deepserve.core.records import DurableSink, LogSink, RunRec, SnapshotRec, Step

from .errors import LogError

Durability = Literal["async", "outbox"]


class FilteredInput(Protocol):
    """What `StepFilter.matches` reads of an input: an `InputRec`, or the head of one
    (`pages.py` decodes only the head of each input to decide whether a page matches)."""

    actor: str
    corr: str | None
    t: float


class StepFilter(NamedTuple):
    """Which steps of a run to read: by input actor, correlation id and input clock
    time in [since, until]; None selects everything."""

    actor: str | None = None
    corr: str | None = None
    since: float | None = None
    until: float | None = None

    @property
    def whole_run(self) -> bool:
        return self.actor is None and self.corr is None and self.since is None and self.until is None

    def matches(self, i: FilteredInput) -> bool:
        return (
            (self.actor is None or i.actor == self.actor)
            and (self.corr is None or i.corr == self.corr)
            and (self.since is None or i.t >= self.since)
            and (self.until is None or i.t <= self.until)
        )


class EndState(NamedTuple):
    """How a run's log ends (`run_ends.py`). `closed`: True, every process that wrote it closed
    it cleanly; False, one or more did not (`missing` names them: died, or still writing);
    None, its end was not recorded (written before schema v7, or a backend that keeps no
    closing records)."""

    closed: bool | None
    missing: tuple[str, ...] = ()


class LogReader(abc.ABC):
    """A log opened for reading. `run_id=None` means the last run begun."""

    label: str

    @abc.abstractmethod
    def runs(self) -> list[RunRec]: ...

    @abc.abstractmethod
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
        """Steps of one run (default: the last run begun) in log order; filters
        select by input actor, correlation id and input clock time [since, until]."""
        return self.read_steps(run_id, StepFilter(actor, corr, since, until))

    @abc.abstractmethod
    def read_steps(self, run_id: str | None, where: StepFilter) -> Iterator[Step]:
        """`steps`, with its filter as one value: what a backend implements."""

    @abc.abstractmethod
    def snapshots(self, run_id: str | None = None, actor: str | None = None) -> Iterator[SnapshotRec]: ...

    def run_end(self, run_id: str | None = None) -> EndState:
        """Whether the run (default: the last) was closed cleanly by every process that wrote
        it (`run_ends.py`); a backend that keeps no closing records answers `EndState(None)`.
        That its closing records agree with its steps is part of `check_integrity`."""
        return EndState(None)

    def check_integrity(self) -> None:
        """Raise a one-line `LogError` if the log's storage is damaged (see
        `sqlite.files.integrity_problems`); a no-op where the backend keeps its own
        integrity (memory, PostgreSQL). Reads the whole file: call it once, before
        answering from an incident log."""
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> LogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SinkStatistics(msgspec.Struct, frozen=True):
    """A writer's state, for the driver's edge and for operators (`statistics()`)."""

    appended: int  # steps appended (the last ticket handed out)
    committed: int  # steps committed
    pending: int  # appended - committed: queued, buffered or in a transaction
    peak_pending: int  # the most `pending` has been
    high_water: int  # pending at or above this: under pressure
    low_water: int  # `wait_for_room` returns once pending is at or below this
    max_pending: int  # the hard bound: beyond it `append` blocks its caller's thread
    transactions: int
    blocked_appends: int  # appends that met the hard bound and blocked
    blocked_s: float  # the time they spent blocked

    @property
    def under_pressure(self) -> bool:
        return self.pending >= self.high_water


class PressureSink(LogSink, Protocol):
    """How a writer tells its driver that the disk is behind (see docs/kernel.md,
    "Backpressure"). A producer at the edge (external inputs) awaits
    `wait_for_room()` before admitting more; actors' own traffic appends freely up to
    `max_pending`, the hard bound, where `append` blocks (last resort: memory stays
    bounded and nothing is lost, but an event loop calling it stalls)."""

    @property
    def under_pressure(self) -> bool:
        """`pending >= high_water`: cheap, for a check on every admission."""
        ...

    async def wait_for_room(self) -> None:
        """Return at once unless under pressure; else wait, without blocking the
        event loop, until pending is down to `low_water` (or the sink failed or
        closed: the next append then raises)."""
        ...

    def statistics(self) -> SinkStatistics: ...


__all__ = [
    "DurableSink", "Durability", "EndState", "LogError", "LogReader", "PressureSink", "SinkStatistics",
    "StepFilter",
]


def __getattr__(name: str) -> object:
    # The in-memory backend lives in `memory.py` (which imports this module); older
    # imports name it from here.
    if name in ("MemoryLog", "MemoryStore"):
        from . import memory

        return getattr(memory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
