"""An actor's state at a clock time, folded from its logged events.

`state == fold(evolve, initial_state(), events)` is the kernel's contract, so the
state at time T needs no re-execution: build the actor from its `Started` input,
then apply the events it recorded in deliveries up to T. System events
(HandlerFailed, Restarted, Stopped) are not state changes and are not folded —
the kernel never passes them to `evolve` either.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.core.actor import Actor, UnknownActorClass
from deepserve.core.cell import build_actor
from deepserve.core.classpath import RefusedClass, load_logged_class
from deepserve.core.codec import DecodeError, decode, to_builtins
from deepserve.core.messages import Raw, Started, Stopped
from deepserve.core.records import SNAPSHOT, Step
from deepserve.persistence.api import LogReader

from .common import ReplayError, load_hint, pick_run, refused_spawn, some


class ActorState(msgspec.Struct):
    actor: str
    at: float | None  # the requested time (None: the end of the log)
    seq: int  # last delivery folded in
    t: float  # its clock time
    alive: bool  # False if the actor had stopped by then
    events: int  # events folded since the actor's last (re)start
    state: Any  # the state object itself (see `state_data` for printing)
    # The actor's records stop before `at` (or the log's end) with no final snapshot: its
    # process ended without a clean stop (killed), or still runs; past `t` the log knows nothing.
    cut: bool = False

    def state_data(self) -> Any:
        """The state as plain data (dicts, lists) for printing and JSON."""
        try:
            return to_builtins(self.state)
        except TypeError:
            return repr(self.state)  # a state msgspec cannot describe: show what Python can


class _Fold:
    """The fold in progress: one actor incarnation and its state."""

    def __init__(self) -> None:
        self.actor: Actor[Any] | None = None
        self.state: Any = None
        self.alive = False
        self.events = 0
        self.seq = 0
        self.t = 0.0

    def start(self, step: Step, started: Started) -> None:
        failed = any(ev.type == "HandlerFailed" for ev in step.events)
        try:
            load_logged_class(started.cls)  # checked before build_actor calls it
        except RefusedClass as exc:  # whatever the log says happened next: it is data
            raise ReplayError(refused_spawn(step.input, exc)) from None
        except UnknownActorClass:
            pass  # build_actor raises it again, answered below
        try:
            self.actor = build_actor(started)
        except UnknownActorClass as exc:
            raise ReplayError(
                f"{step.input.actor}#{step.input.seq}: {exc} ({load_hint(started.cls)})"
            ) from None
        except Exception as exc:  # noqa: BLE001 — constructor errors are user code
            if not failed:
                raise ReplayError(
                    f"{step.input.actor}#{step.input.seq}: rebuilding {started.cls} "
                    f"raised {type(exc).__name__}: {exc}"
                ) from None
            self.actor = None  # it failed to start in the original run too
        self.state = self.actor.initial_state() if self.actor is not None else None
        self.alive = self.actor is not None
        self.events = 0

    def apply(self, step: Step) -> None:
        rec = step.input
        for ev in step.events:
            try:
                event = decode(ev.type, ev.payload)
            except DecodeError as exc:
                raise ReplayError(f"{rec.actor}#{rec.seq}: {exc}") from None
            if type(event) is Raw:
                raise ReplayError(
                    f"{rec.actor}#{rec.seq}: event type {ev.type!r} is not registered in this "
                    f"process (import the module that defines it: --import MODULE, --path DIR)"
                )
            if type(event) is Stopped:
                self.alive = False
            if event.system:
                continue
            assert self.actor is not None
            self.state = self.actor.evolve(self.state, event)
            self.events += 1
        self.seq, self.t = rec.seq, rec.t


def state_at(
    reader: LogReader, actor: str, at: float | None = None, run_id: str | None = None
) -> ActorState:
    """`actor`'s state after every delivery with clock time <= `at` (default: all)."""
    run = pick_run(reader, run_id)
    fold: _Fold | None = None
    beyond, last_kind = False, int(SNAPSHOT)
    for step in reader.steps(run.run_id, actor=actor):
        rec = step.input
        if at is not None and rec.t > at:
            beyond = True  # the actor has records after `at`: it was there, whatever it did
            break
        last_kind = rec.kind
        if rec.seq < 0:
            continue  # a dead letter (or a final snapshot): no delivery to fold
        if rec.type == "Started":  # a spawn, a re-spawn or an in-place restart: start over
            fold = fold or _Fold()
            started = decode("Started", rec.payload)
            assert isinstance(started, Started)
            fold.start(step, started)
        elif fold is None:
            raise ReplayError(f"{actor}#{rec.seq}: first logged input is {rec.type}, not Started")
        fold.apply(step)
    if fold is None:
        if beyond and at is not None:  # it has records, all after `at` (--at -5: before any clock)
            raise ReplayError(f"{actor!r} has no record at or before t={at:g} in run {run.run_id!r}: "
                              f"its first is at t={rec.t:.6f}")  # fmt: skip
        known = some(reader.actors(run.run_id))
        raise ReplayError(f"no actor {actor!r} in run {run.run_id!r} (actors: {known})")
    # A clean end (a run's end, a stop) leaves a final snapshot of every live actor.
    cut = fold.alive and not beyond and last_kind != SNAPSHOT
    return ActorState(actor, at, fold.seq, fold.t, fold.alive, fold.events, fold.state, cut)
