"""The thread writer taking pages of steps the driver encoded itself (`append_page`), beside
`append`'s one `Step` at a time: for the SQLite paged layout (`sqlite/page_store.py`), which
stores each transaction's steps as one page anyway.

Why: `AsyncDriver` (core/asynclog.py) writes each delivery's msgpack straight into a page as it
is made (`core/pagewriter.py`), and hands the page over every `page_hold_s`. Per delivery that
saves building the `Step` (`make_step`), a locked `append`, and the writer thread's msgspec
encoding of the Step (~12 % of the daemon's CPU under `bench http`, py-spy, issue 30 §1). The
page store puts a transaction's `Step`s and pages into one page body (`pages.page_body`): the
same bytes `append` would have led to, as tests/persistence/test_paged_sink.py checks.
"""

from __future__ import annotations

from deepserve.core.records import RunRec, Step

from .errors import LogError
from .group_commit import GroupCommitSink
from .pages import EncodedSteps


class PagedGroupCommitSink(GroupCommitSink):
    """`GroupCommitSink` + `append_page` (the writer process's `ProcessSink` has the same)."""

    @property
    def page_steps(self) -> int:
        """The most steps a page handed over may hold (`max_batch`)."""
        return self._max_batch

    @property
    def page_hold_s(self) -> float:
        """How long a driver may keep a page open before handing it over: the writer's linger
        (it waits that long after a wake-up before it commits anyway), or half its flush window
        (`flush_s`: it commits at most that often, so a page a window's steps is what it stores
        anyway; each hand-over costs a lock, a wake-up of this thread and a GIL hand-off)."""
        return max(self._linger_s, self._flush_s / 2)

    def append_page(self, body: bytes | bytearray, steps: int, t_first: float, t_last: float) -> int:
        """Queue `steps` steps encoded back to back (`core.steps.StepPage`; input times within
        [t_first, t_last]) after everything appended so far; returns the last one's ticket."""
        if not 0 < steps <= self._max_batch:
            raise ValueError(f"append_page: {steps} steps; a page holds 1..{self._max_batch}")
        with self._lock:
            if not self._has_run:
                self._check_open()
                raise LogError(f"{self.label}: append_page() before begin_run()")
            self._put(EncodedSteps(bytes(body), steps, t_first, t_last))  # type: ignore[arg-type]
            self._ticket += steps
            self._note_pending()
            return self._ticket

    def _batch_items(self, queue: list[Step | RunRec]) -> int:
        """Items up to `max_batch` steps (at least one item)."""
        limit, steps = self._max_batch, 0
        for i, item in enumerate(queue):
            steps += item.steps if type(item) is EncodedSteps else 1  # type: ignore[union-attr]
            if steps >= limit:
                return i + 1
        return len(queue)


__all__ = ["PagedGroupCommitSink"]
