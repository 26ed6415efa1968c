"""A request's output stream as its client sees it, when several tasks of the request produce
it (a P/D decode continuing its prefill, a retry, a migrated stream resuming on another TE):
each chunk carries its tokens' indices, so the stream is merged by index — a newer task takes
over from the first chunk it sends at or below the client's next index, the tokens the client
already has are dropped from it, and an older task's chunks are dropped from then on. The
emulated output is a pure function of the seed and the index, so the tokens a newer task
re-generates are the ones the client has: nothing is sent twice and nothing is skipped.

Pure; the frontend (daemon/generation.py) follows its streams with it.
"""

from __future__ import annotations

DROP = -1


def task_order(task_id: str) -> tuple[int, int, int]:
    """A task's place among its request's tasks (the JE names them `rid/phase.attempt`, and
    `rid/phase.attempt.epoch` once the gateway moved the request to another JE, decide.task_id):
    a later epoch is newer (the lost JE's tasks are abandoned); within one, a later attempt;
    within one, the decode follows its prefill."""
    phase, _, rest = task_id.rpartition("/")[2].partition(".")
    attempt, _, epoch = rest.partition(".")
    return (int(epoch) if epoch.isdigit() else 0, int(attempt) if attempt.isdigit() else 0,
            1 if phase == "decode" else 0)  # fmt: skip


class StreamMerge:
    """Which part of each chunk the client gets: `take` returns how many of the chunk's leading
    tokens to drop (the client has them), or DROP for the whole chunk."""

    __slots__ = ("next", "task", "order")

    def __init__(self) -> None:
        self.next = 0  # the index of the client's next token
        self.task = ""  # the task followed
        self.order = (-1, -1, -1)

    def take(self, task_id: str, first: int, count: int) -> int:
        if task_id != self.task:
            order = task_order(task_id)
            if order <= self.order or first > self.next:
                return DROP  # an older (abandoned) task, or one that would leave a gap
            self.task, self.order = task_id, order
        skip = self.next - first
        if skip < 0:  # the followed task left a gap: it cannot be filled, the chunk goes out
            skip = 0
        if skip >= count:
            return DROP
        self.next = first + count
        return skip
