"""The actor base class and its supervision policy.

An actor handles one message at a time in a *synchronous* `handle`. It reads time,
randomness and identity only through its `Context`, and changes `self.state` only
by recording events that `evolve` folds in: `state == fold(evolve, initial, events)`.
"""

from __future__ import annotations

import abc
import enum
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

import msgspec

from .classpath import UnknownActorClass, class_path, load_class, main_module_name
from .messages import Event, Message

if TYPE_CHECKING:
    from .context import Context

S = TypeVar("S")


class Directive(enum.Enum):
    RESTART = "restart"  # rebuild state from snapshot + committed events, keep going
    STOP = "stop"  # record the failure and stop the actor
    ESCALATE = "escalate"  # stop, and tell the parent with `ChildFailed`


class Supervision(msgspec.Struct, frozen=True):
    directive: Directive = Directive.RESTART
    # A limit on everything: more restarts than this inside the window stops the actor.
    max_restarts: int = 10
    window_s: float = 60.0


class MissingEvolve(TypeError):
    """An actor recorded an event but has no `evolve` to apply it."""


class Actor(abc.ABC, Generic[S]):
    """Subclass, set `initial_state`, implement `handle` and (if you record) `evolve`.

    Constructor arguments must be msgspec-encodable keywords: they are logged in the
    actor's `Started` input so that replay can rebuild it.
    """

    supervision: ClassVar[Supervision] = Supervision()
    # Snapshot policy (cost-aware): a snapshot once at least this many events, and
    # at least as many bytes of events as the last snapshot's size, were recorded
    # since the last one. A large state is thus copied rarely; see docs/kernel.md.
    snapshot_every: ClassVar[int] = 1024

    state: S

    def initial_state(self) -> S:
        return None  # type: ignore[return-value]

    def evolve(self, state: S, event: Event) -> S:
        # Actors that never record need no evolve; one that records without it fails
        # that delivery (supervised like any handler error), naming what is missing.
        raise MissingEvolve(
            f"{type(self).__name__} recorded {type(event).__name__} but defines no evolve()"
        )

    def on_start(self, ctx: Context) -> None:
        """Called once, in the actor's `Started` delivery, after `initial_state`:
        it may record, send, set timers and spawn like a handler. Does nothing by
        default."""
        return None

    @abc.abstractmethod
    def handle(self, ctx: Context, msg: Message) -> None:
        """React to one message: read `self.state`, record events, send, set timers."""


__all__ = [
    "Actor", "Directive", "MissingEvolve", "Supervision", "UnknownActorClass", "class_path",
    "load_class", "main_module_name",
]
