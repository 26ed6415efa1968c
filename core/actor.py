"""The actor base class and its supervision policy.

An actor handles one message at a time in a *synchronous* `handle`. It reads time,
randomness and identity only through its `Context`, and changes `self.state` only
by recording events that `evolve` folds in: `state == fold(evolve, initial, events)`.
"""

from __future__ import annotations

import abc
import enum
import os
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import msgspec

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

    @abc.abstractmethod
    def handle(self, ctx: Context, msg: Message) -> None:
        """React to one message: read `self.state`, record events, send, set timers."""


def class_path(cls: type) -> str:
    """"module:QualName", by which replay loads the class. A class of the script run as
    `__main__` is named by the script's importable name where it can be known (see
    `main_module_name`), so that another process can import it."""
    module = cls.__module__
    if module == "__main__":
        module = main_module_name() or module
    return f"{module}:{cls.__qualname__}"


def main_module_name() -> str | None:
    """The name under which the script running as `__main__` can be imported elsewhere:
    `python -m pkg.mod` -> "pkg.mod"; `python dir/script.py` -> "script" (importable
    with `dir` on the path: `deepserve replay --path dir`); None for `python -c`, a REPL."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__":
        return str(name)
    file = getattr(main, "__file__", None)
    if isinstance(file, str):
        stem = os.path.splitext(os.path.basename(file))[0]
        if stem.isidentifier() and stem != "__main__":
            return stem
    return None


class UnknownActorClass(LookupError):
    pass


def load_class(path: str) -> type:
    """Inverse of `class_path`."""
    import importlib

    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = sys.modules.get(module_name)
        if obj is None and module_name == main_module_name():
            obj = sys.modules["__main__"]  # this process is that script: never import it twice
        if obj is None:
            obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownActorClass(f"cannot load actor class {path!r}: {exc}") from None
    return obj
