"""Exact re-execution: feed every actor its logged inputs, compare what it does.

Each step is re-run through `core.cell.execute` — the very function the drivers
use — and its records are rebuilt with `event_records`/`output_records`, so any
difference is a difference in the actor's behaviour, not in the tooling. Steps
are streamed in log order with one live `Cell` per actor: memory is bounded by
the number of actors, never by the length of the log.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.core.cell import Cell, execute
from deepserve.core.classpath import RefusedClass, UnknownActorClass, load_logged_class
from deepserve.core.codec import DecodeError, decode
from deepserve.core.codeid import CODE_VERSION
from deepserve.core.envelope import Envelope
from deepserve.core.messages import HandlerFailed, Started, registered
from deepserve.core.records import SNAPSHOT, EventRec, Step
from deepserve.core.steps import event_records, folded_snapshot, output_records, snapshot_record
from deepserve.persistence.api import LogReader

from .common import (
    ReplayError,
    event_view,
    input_view,
    load_hint,
    mask_addresses,
    output_view,
    pick_run,
    refused_spawn,
    snapshot_view,
)


class Divergence(msgspec.Struct):
    """The first place where re-execution did not reproduce the log."""

    actor: str
    seq: int
    t: float
    input: dict[str, Any]  # the input that caused it: type, decoded payload, src, corr
    what: str  # "event 2", "output 0", "snapshot"
    expected: Any  # the logged record (decoded), or None if re-execution made an extra one
    actual: Any  # the re-executed record (decoded), or None if it is missing


class VerifyResult(msgspec.Struct):
    run_id: str
    identical: bool
    actors: int  # actors re-executed (an address re-spawned counts once)
    inputs: int  # deliveries re-executed, up to and including a divergence
    divergence: Divergence | None = None
    logged_code: str = ""  # the run record's code_version, when it is not this code's
    # Whether the log ends with the run's final snapshots (its driver closed it). A killed
    # process's log, or a copy that lost its -wal file, ends with a delivery instead: what
    # is there verifies, but it is not the whole run, and the line says so.
    ended: bool = True
    # Whether every process that wrote the run closed its log (its closing record, schema v7,
    # agreeing with the steps: else the reader refused the log): False, the log stops where a
    # process died; None, not recorded (a log from before v7, an in-memory log).
    closed: bool | None = None

    def summary(self) -> str:
        """One line, naming the run checked (a log may hold several)."""
        if self.identical and self.closed is False:
            return (f"identical as far as the log goes: {self.actors} actors, {self.inputs} inputs "
                    f"(run {self.run_id!r}); the log has no closing record (its process died, or "
                    "still runs): the rest of the run is unknown")  # fmt: skip
        if self.identical:
            line = f"identical: {self.actors} actors, {self.inputs} inputs (run {self.run_id!r})"
            if not self.ended:
                line += ("; the log stops before the run's end (no final snapshots: a killed process, "
                         "or a copy without its -wal file?)")  # fmt: skip
            return line
        d = self.divergence
        if d is None:
            raise ValueError("a diverged VerifyResult needs its divergence")
        line = f"diverged: {d.actor}#{d.seq} at t={d.t:.6f}, {d.what} (run {self.run_id!r})"
        if self.logged_code:
            line += (f"; the log was written by code {self.logged_code} and this is "
                     f"{CODE_VERSION}: a change to the code can explain it")  # fmt: skip
        return line


def verify(reader: LogReader, run_id: str | None = None) -> VerifyResult:
    """Re-execute every delivery of one run (default: the last) and compare."""
    run = pick_run(reader, run_id)
    closed = reader.run_end(run.run_id).closed
    other_code = run.code_version if run.code_version != CODE_VERSION else ""
    seed = run.seed
    cells: dict[str, Cell] = {}
    decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
    inputs = 0
    last_kind = -1
    # The loop is the hot path (>= 100k inputs/s): the common case — a known
    # actor's next input of an already seen type — touches no helper function.
    for step in reader.steps(run.run_id):
        rec = step.input
        seq = rec.seq
        last_kind = rec.kind
        if seq < 0:  # a dead letter or a drop: nothing was executed
            if rec.kind == SNAPSHOT and step.snapshot is not None:
                divergence = _final_state_difference(cells, step)
                if divergence is not None:
                    return VerifyResult(run.run_id, False, len(cells), inputs, divergence, other_code,
                                        closed=closed)  # fmt: skip
            continue
        cell = cells.get(rec.actor)
        if cell is None or seq != cell.seq + 1 or not cell.alive or rec.type == "Started":
            cell = _cell_for(cells, step, seed)
        dec = decoders.get(rec.type)
        if dec is None:
            dec = _decoder(decoders, step)
        try:
            msg = dec.decode(rec.payload)
        except msgspec.DecodeError as exc:
            raise ReplayError(f"{rec.actor}#{seq}: payload of type {rec.type!r} does not decode: {exc}") from None
        env = Envelope(
            rec.src, rec.actor, rec.msg_id, rec.src_hlc, rec.corr, msg, rec.reply_to,
            rec.ask, rec.external, rec.payload,
        )
        snapped = execute(cell, env, rec.t)
        inputs += 1
        ctx = cell.ctx
        if not (
            event_records(cell, ctx.events) == step.events
            and output_records(cell, ctx.outputs) == step.outputs
            and (step.snapshot is None if not snapped else snapshot_record(cell) == step.snapshot)
        ):  # not byte-identical: find where, unless only tracebacks differ
            divergence = _first_difference(cell, step, snapped)
            if divergence is not None:
                return VerifyResult(run.run_id, False, len(cells), inputs, divergence, other_code,
                                    closed=closed)  # fmt: skip
    return VerifyResult(run.run_id, True, len(cells), inputs, ended=last_kind == SNAPSHOT, closed=closed)


def _final_state_difference(cells: dict[str, Cell], step: Step) -> Divergence | None:
    """An actor's logged live state (run end, stop) against the fold of its events
    as re-executed here: catches a changed `evolve`, and state changed outside
    `record` (a handler mutating `self.state` in place)."""
    rec, want = step.input, step.snapshot
    assert want is not None
    cell = cells.get(rec.actor)
    if cell is None or cell.actor is None or cell.snap is None:
        raise ReplayError(f"{rec.actor}: a final snapshot for an actor that never started")
    got = folded_snapshot(cell)
    if got == want:
        return None
    return Divergence(
        rec.actor, want.seq, rec.t, input_view(rec), "final state",
        snapshot_view(want), snapshot_view(got),
    )


def _decoder(decoders: dict[str, msgspec.msgpack.Decoder[Any]], step: Step) -> msgspec.msgpack.Decoder[Any]:
    """The decoder for an input's type, once the type is known to be registered.
    Unknown types are not cached: a later actor class import may register them."""
    rec = step.input
    cls = registered(rec.type)
    if cls is None:
        raise ReplayError(
            f"{rec.actor}#{rec.seq}: input type {rec.type!r} is not registered in this process "
            f"(import the module that defines it: --import MODULE, --path DIR)"
        )
    if cls is Started:
        _check_loadable(step)  # checked per Started, so not cached
        return msgspec.msgpack.Decoder(Started)
    dec = decoders[rec.type] = msgspec.msgpack.Decoder(cls)
    return dec


def _cell_for(cells: dict[str, Cell], step: Step, seed: int) -> Cell:
    """The cell that receives this input, mirroring how the drivers pick it: a
    `Started` to a stopped (or never seen) address is a new incarnation whose
    numbering continues; a `Started` to a live one restarts it in place."""
    rec = step.input
    cell = cells.get(rec.actor)
    if rec.type == "Started" and (cell is None or not cell.alive):
        cell = cells[rec.actor] = Cell(rec.actor, seed, rec.seq - 1)
        return cell
    if cell is None:
        raise ReplayError(
            f"{rec.actor}#{rec.seq}: first logged input is {rec.type}, not Started "
            f"(the log does not hold this actor's spawn)"
        )
    if not cell.alive:
        raise ReplayError(f"{rec.actor}#{rec.seq}: {rec.type} delivered after the actor stopped")
    if rec.seq != cell.seq + 1:
        raise ReplayError(
            f"{rec.actor}#{rec.seq}: inputs are not consecutive (previous was #{cell.seq})"
        )
    return cell


def _check_loadable(step: Step) -> None:
    """An actor class this process cannot import is a problem with the replay
    environment, not a divergence — unless the original run failed the same way."""
    rec = step.input
    try:
        started = msgspec.msgpack.decode(rec.payload, type=Started)
        load_logged_class(started.cls)
    except msgspec.DecodeError:
        return  # reported by the caller's decode, with the actor and seq
    except RefusedClass as exc:  # whatever the log says happened next: it is data, never code
        raise ReplayError(refused_spawn(rec, exc)) from None
    except UnknownActorClass as exc:
        if step.events and step.events[0].type == "HandlerFailed":
            return  # it failed to start in the original run too: re-execution will agree
        raise ReplayError(f"{rec.actor}#{rec.seq}: {exc} ({load_hint(started.cls)})") from None


def _first_difference(cell: Cell, step: Step, snapped: bool) -> Divergence | None:
    """Locate the first differing record; None if the only differences are
    handler tracebacks (they hold file paths and line numbers, not behaviour) and
    memory addresses in error texts."""
    rec = step.input
    events = event_records(cell, cell.ctx.events)
    outputs = output_records(cell, cell.ctx.outputs)

    def diverged(what: str, expected: Any, actual: Any) -> Divergence:
        return Divergence(rec.actor, rec.seq, rec.t, input_view(rec), what, expected, actual)

    for i in range(max(len(events), len(step.events))):
        want = step.events[i] if i < len(step.events) else None
        got = events[i] if i < len(events) else None
        if not _same_event(want, got):
            return diverged(f"event {i}", _view(event_view, want), _view(event_view, got))
    for i in range(max(len(outputs), len(step.outputs))):
        want_o = step.outputs[i] if i < len(step.outputs) else None
        got_o = outputs[i] if i < len(outputs) else None
        if want_o != got_o:
            return diverged(f"output {i}", _view(output_view, want_o), _view(output_view, got_o))
    actual_snap = snapshot_record(cell) if snapped else None
    if actual_snap != step.snapshot:
        return diverged("snapshot", snapshot_view(step.snapshot), snapshot_view(actual_snap))
    return None


def _same_event(want: EventRec | None, got: EventRec | None) -> bool:
    if want is None or got is None:
        return want is got
    if want == got:
        return True
    if want.type == got.type == "HandlerFailed":
        try:
            a = decode("HandlerFailed", want.payload)
            b = decode("HandlerFailed", got.payload)
        except DecodeError:
            return False
        assert isinstance(a, HandlerFailed) and isinstance(b, HandlerFailed)
        same_place = (want.actor, want.seq, want.idx) == (got.actor, got.seq, got.idx)
        return same_place and mask_addresses(a.error) == mask_addresses(b.error)
    return False


def _view(render: Any, rec: Any) -> Any:
    return None if rec is None else render(rec)
