"""Checks that an actor's snapshots taken from its live state (`Actor.snapshot_from_live`) are the
fold of its logged events: shared by the DP master's, the NPU's and the JE's tests."""

from __future__ import annotations

from typing import Any

from deepserve.core import MemorySink, decode, encode


def checked_snapshots(sink: MemorySink, driver: Any, prefix: str, cls: type) -> dict[str, int]:
    """Fold each `cls` actor under `prefix` from its logged events, compare every snapshot its
    deliveries logged with the fold at that step (assert), and count the snapshots compared."""
    folds: dict[str, Any] = {}
    checked: dict[str, int] = {}
    for step in sink.steps:
        addr = step.input.actor
        if not addr.startswith(prefix) or not isinstance(driver.actor(addr), cls):
            continue
        actor = driver.actor(addr)
        state = folds.get(addr)
        if state is None:
            state = actor.initial_state()
        for rec in step.events:
            event = decode(rec.type, rec.payload)
            if not event.system:
                state = actor.evolve(state, event)
        folds[addr] = state
        if step.snapshot is not None and step.input.seq >= 0 and step.input.kind == 0:
            assert step.snapshot.payload == encode(state), f"{addr} at seq {step.input.seq}"
            checked[addr] = checked.get(addr, 0) + 1
    return checked
