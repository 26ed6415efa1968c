"""Restoring a `SimDriver` at a clock time T from what a log recorded (issue 32: `--from T`).

A restore puts back exactly what the driver held after its last delivery at or before T: each
live actor's cell (its incarnation's `Started`, its delivery counter, clock, output counter,
last snapshot and the events since — the restart path's own inputs, `cell.restore_state` —, its
open and failed asks, its restart times), the virtual clock, the external-input counter, the
retired addresses' counters, and every pending entry: live timers and scheduled external inputs.
Sends need none: a send is due at its sender's time, so every send made by T was delivered by T.

The actor is built afresh from its `Started` (as replay does), and its state is the last
snapshot folded with the events since — `state == fold(evolve, snapshot, events)`, the kernel's
contract, which a restart relies on too. `on_start` is not called again (its effects are in the
log). Randomness needs nothing: `ctx.rng` is seeded per delivery from (run seed, address,
delivery counter), so the counter positions it.

Pending entries keep their original order: the caller hands them over in the order the original
driver queued them (`restore_timer`, `restore_scheduled`), each taking the next queue sequence
number; entries queued after the restore come later, as in the original.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from heapq import heappush
from typing import Any

from .cell import FAILED_ASKS_KEPT, Cell, build_actor, encode_state
from .envelope import Envelope
from .messages import Event, Started
from .sim import SimDriver


class CellImage:
    """What a log says about one live actor at T (replay/fork.py reads it)."""

    __slots__ = (
        "addr", "started", "seq", "hlc", "out_seq", "snap_state", "snap_bytes", "events_since",
        "event_bytes", "final_seq", "restart_times", "open_asks", "failed_asks",
    )

    def __init__(self, addr: str, started: Started) -> None:
        self.addr = addr
        self.started = started
        self.seq = 0
        self.hlc = 0
        self.out_seq = 0
        self.snap_state: Any = None  # None: the initial state (the start's snapshot is not logged)
        self.snap_bytes: bytes | None = None
        self.events_since: list[Event] = []  # non-system events after the snapshot, in order
        self.event_bytes = 0
        self.final_seq = -1
        self.restart_times: list[float] = []
        self.open_asks: set[int] = set()
        self.failed_asks: dict[int, None] = {}


def restore_cell(driver: SimDriver, image: CellImage) -> Cell:
    """Put a live actor back (module docstring); its state is the snapshot folded with the events."""
    cell = Cell(image.addr, driver.seed, image.seq)
    driver.cells[image.addr] = cell
    actor = cell.actor = build_actor(image.started)
    if image.snap_state is None or image.snap_bytes is None:
        snap: Any = actor.initial_state()
        snap_bytes = encode_state(cell, snap)
    else:
        snap, snap_bytes = image.snap_state, image.snap_bytes
    cell.snap = (snap, type(snap), snap_bytes)  # type: ignore[assignment]
    state = copy.deepcopy(snap)
    for event in image.events_since:
        state = actor.evolve(state, event)
    actor.state = state
    cell.parent = image.started.parent
    cell.hlc = image.hlc
    cell.out_seq = image.out_seq
    cell.events_since_snap = list(image.events_since)
    cell.event_bytes_since_snap = image.event_bytes
    cell.final_seq = image.final_seq
    cell.restart_times = list(image.restart_times)
    cell.open_asks = set(image.open_asks)
    failed = dict(image.failed_asks)
    while len(failed) > FAILED_ASKS_KEPT:
        del failed[next(iter(failed))]
    cell.failed_asks = failed
    return cell


def restore_timer(driver: SimDriver, deadline: float, env: Envelope, key: str) -> None:
    """A live timer, next in the original queue's order."""
    driver._set_timer(deadline, env, key)  # noqa: SLF001 (the kernel's own hook)


def restore_scheduled(driver: SimDriver, at: float, env: Envelope) -> None:
    """A scheduled external input (`inject` with a later `at`), next in the original order;
    `env.msg_id` is the one it had (the external counter when it was injected)."""
    driver._seq += 1  # noqa: SLF001
    heappush(driver._scheduled, (at, driver._seq, env, None))  # noqa: SLF001


def set_clock(driver: SimDriver, now: float, ext_seq: int, retired: Iterable[tuple[str, int]] = ()) -> None:
    """The clock at T, the external inputs' counter, and stopped addresses' delivery counters (a
    re-spawn continues the numbering)."""
    driver.now = now
    driver._ext_seq = ext_seq  # noqa: SLF001
    for addr, seq in retired:
        driver._retired_seq[addr] = seq  # noqa: SLF001


__all__ = ["CellImage", "restore_cell", "restore_scheduled", "restore_timer", "set_clock"]
