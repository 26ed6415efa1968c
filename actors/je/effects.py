"""What the JE's decision core asks for, and the port it asks through.

The core (`flow.py`, `core.py`) never touches a `Context`: it reads the JE's state and one input
and emits effects into an `Effects` — an event to record, a message to send, a timer to set or
cancel. The actor passes its context (which records, sends and sets timers for real); a test
passes a `Plan`, which lists the effects as data. Either applies each event to the state the
moment it is emitted (`ctx.record` folds it through `evolve`), because the core's next decision in
the same delivery reads what that event changed: a failed task's JE record excludes its TE before
the retry is routed, a finished job leaves the batch it belonged to before the queue is pumped.
A core that returned one list at the end would have to re-implement `evolve` to see that.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

from deepserve.actors.scheduling.locality import MAX_BLOCKS_DEFAULT
from deepserve.core import Event, Message

from .messages import JeState
from .state import evolve


class Effects(Protocol):
    """The four things the core may ask for (`Context` has exactly these)."""

    def record(self, event: Event) -> None: ...

    def send(self, dst: str, msg: Message, corr: str | None = None) -> object: ...

    def after(self, delay_s: float, msg: Message, key: str | None = None) -> object: ...

    def cancel(self, key: str) -> None: ...


class Send(msgspec.Struct, frozen=True):
    dst: str
    msg: Message
    corr: str | None = None  # None: the input's


class After(msgspec.Struct, frozen=True):
    delay_s: float
    msg: Message
    key: str | None = None


class Cancel(msgspec.Struct, frozen=True):
    key: str


Effect = Event | Send | After | Cancel


class Plan:
    """`Effects` as data, for tests without a driver: `steps` lists every effect in order, and
    each event is applied to `state` at once (the JE's `evolve`, in place), as a context does."""

    def __init__(self, state: JeState, max_tree_blocks: int = MAX_BLOCKS_DEFAULT) -> None:
        self.state = state
        self.max_tree_blocks = max_tree_blocks
        self.steps: list[Effect] = []

    def record(self, event: Event) -> None:
        self.state = evolve(self.state, event, self.max_tree_blocks)
        self.steps.append(event)

    def send(self, dst: str, msg: Message, corr: str | None = None) -> None:
        self.steps.append(Send(dst, msg, corr))

    def after(self, delay_s: float, msg: Message, key: str | None = None) -> None:
        self.steps.append(After(delay_s, msg, key))

    def cancel(self, key: str) -> None:
        self.steps.append(Cancel(key))

    def take(self) -> list[Effect]:
        """The effects so far, and a fresh list for the next input."""
        steps, self.steps = self.steps, []
        return steps

    def events(self) -> list[Event]:
        return [e for e in self.steps if isinstance(e, Event)]

    def sent(self) -> list[Send]:
        return [e for e in self.steps if isinstance(e, Send)]
