"""`MergedLog`: one `LogReader` over a daemon run directory (one SQLite file per process).

Steps of the per-file streams are merged by input HLC with `heapq.merge`; equal
HLCs go in file-name order, then insertion order. HLCs are per actor, so a file's
own stream is not sorted by HLC: the merge then never reorders a file's steps among
themselves (it only interleaves files), which keeps each process's log order intact.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator

from deepserve.core.records import RunRec, SnapshotRec, Step

from .api import EndState, LogReader, StepFilter
from .errors import LogError
from .sql_reader import SqlLog


def _hlc(step: Step) -> int:
    return step.input.hlc


def _is_partition(log: SqlLog, run: str) -> bool:
    for rec in log.runs():
        if rec.run_id == run:
            try:
                return "partition" in json.loads(rec.config)
            except ValueError:
                return False
    return False


class MergedLog(LogReader):
    def __init__(self, label: str, logs: list[SqlLog]) -> None:
        self.label = label
        self.logs = logs  # in file-name order

    def runs(self) -> list[RunRec]:
        return [run for log in self.logs for run in log.runs()]

    def _logs_with(self, run_id: str | None) -> tuple[str | None, list[SqlLog]]:
        """The run to read (default: the one begun last, by wall clock) and the files
        that hold it."""
        if run_id is None:
            every = [
                (run.started_at, i, run.run_id)
                for i, log in enumerate(self.logs)
                for run in log.runs()
            ]
            if not every:
                return None, []
            run_id = max(every)[2]
        holders = [log for log in self.logs if log.has_run(run_id)]
        if not holders:
            raise LogError(f"{self.label}: no run {run_id!r} in this log")
        return run_id, holders

    def actors(self, run_id: str | None = None) -> list[str]:
        run, logs = self._logs_with(run_id)
        return sorted({a for log in logs for a in log.actors(run)})

    def read_steps(self, run_id: str | None, where: StepFilter) -> Iterator[Step]:
        run, logs = self._logs_with(run_id)
        self._one_actor(run, logs, where.actor)
        streams = [log.read_steps(run, where) for log in logs]
        yield from heapq.merge(*streams, key=_hlc)

    def snapshots(
        self, run_id: str | None = None, actor: str | None = None
    ) -> Iterator[SnapshotRec]:
        run, logs = self._logs_with(run_id)
        self._one_actor(run, logs, actor)
        for log in logs:
            yield from log.snapshots(run, actor)

    def _one_actor(self, run: str | None, logs: list[SqlLog], actor: str | None) -> None:
        """A simulation split over workers (`deepserve sim --workers`: each run's config names
        its partition) has actors of the same address in several files, alive side by side: the
        fabric, the workload actor. Merged, their steps would fold into one state that none of
        them had: refuse, naming the files (a daemon's replaced TE lives in one file after
        another, and still merges)."""
        if actor is None or run is None or not any(_is_partition(log, run) for log in logs):
            return  # (listing a file's actors reads its pages: only for a split simulation)
        holders = [log for log in logs if actor in log.actors(run)]
        if len(holders) < 2:
            return
        names = ", ".join(log.label for log in holders)
        raise LogError(f"{self.label}: {actor} is a different actor in each of {len(holders)} logs of "
                       f"a simulation split over workers ({names}): read one of them")  # fmt: skip

    def run_end(self, run_id: str | None = None) -> EndState:
        """Closed if every file holding the run closed it; `missing` names the files not closed."""
        run, logs = self._logs_with(run_id)
        states = [(log.label, log.run_end(run)) for log in logs]
        if not states or any(st.closed is None for _, st in states):
            return EndState(None)
        missing = tuple(label for label, st in states if st.missing)  # the files not closed
        return EndState(not missing, missing)

    def check_integrity(self) -> None:
        for log in self.logs:
            log.check_integrity()

    def close(self) -> None:
        for log in self.logs:
            log.close()
