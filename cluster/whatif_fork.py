"""`replay whatif --from T`: the change, and the fallback when the driver cannot be restored at T.

The fork itself restores the driver at T from the log (cluster/whatif_restore.py, replay/fork.py,
core/restore.py). What this module keeps: which root actors a change alters (`changed_actors`:
the gateway, the JEs, the cluster manager, the heartbeat monitor, the pod launcher, a device;
rebuilt with the new spawn arguments at T, keeping their state; a change that adds or removes
actors is refused, having no state at T), and the path taken when the log cannot say everything
the driver held at T (replay/fork.py `Cut.unsure`; a snapshot of a state type the actor's modules
do not define): the recorded run re-run under its own config from the start up to T, every step
hashed as the log stores it and checked against the log's steps up to T (`PrefixHash`), the
change applied to the live cluster there (`fork_tap`), and the run goes on — a whole re-run's
cost. TEs are configured by the pod launcher when they boot, so in both paths a TE-level change
reaches the TEs booted after T (replacements), not the running ones.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from deepserve.core import SimDriver
from deepserve.core.records import RunRec, Step
from deepserve.replay.common import ReplayError

from .assembly import assemble
from .schema import PlatformConfig
from .sim import STREAM_ADDR

PAGE_STEPS = 512


class PrefixHash:
    """A log sink hashing the bytes of each step up to `until_s`, as a log stores them (the
    driver's pages: steps encoded back to back; a page across `until_s` is split by its steps'
    times). The rest of the run it takes and drops."""

    page_steps = PAGE_STEPS

    def __init__(self, until_s: float) -> None:
        self.until_s = until_s
        self.h = hashlib.blake2b(digest_size=32)
        self.steps = 0

    def begin_run(self, run: RunRec) -> None:
        return None

    def append(self, step: Step) -> int:  # (the driver hands a page sink pages only)
        raise AssertionError("PrefixHash takes pages")

    def append_page(self, body: bytes, steps: int, t_first: float, t_last: float) -> int:
        if t_first > self.until_s:
            return 0
        if t_last <= self.until_s:
            self.h.update(body)
            self.steps += steps
            return 0
        head = b"\xdd" + steps.to_bytes(4, "big")  # a msgpack array of the page's steps
        for raw, st in zip(_RAWS.decode(head + body), _HEADS.decode(head + body), strict=True):
            if st.input.t > self.until_s:
                break
            self.h.update(raw)
            self.steps += 1
        return 0

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


class _InputTime(msgspec.Struct, array_like=True):
    actor: str
    seq: int
    t: float


class _StepTime(msgspec.Struct, array_like=True):
    input: _InputTime


_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])
_HEADS = msgspec.msgpack.Decoder(list[_StepTime])


class _Recorder:
    """Stands in for a driver to `assemble`: keeps each root actor's spawn arguments."""

    def __init__(self) -> None:
        self.spawned: dict[str, tuple[type, dict[str, Any]]] = {}

    def spawn(self, addr: str, cls: type, *, src: str = "ext/operator", **kwargs: Any) -> str:
        self.spawned[addr] = (cls, kwargs)
        return addr


def built_of(cfg: PlatformConfig) -> Any:
    """What `assemble` says it built for `cfg` (the gateway's address, the layout), spawning nothing."""
    return assemble(_Recorder(), cfg, stream_to=STREAM_ADDR)


def gateway_of(cfg: PlatformConfig) -> str:
    return str(built_of(cfg).gateway)


def spawns(cfg: PlatformConfig, forced: dict[str, str] | None = None) -> dict[str, tuple[type, dict[str, Any]]]:
    rec = _Recorder()
    assemble(rec, cfg, stream_to=STREAM_ADDR, forced=forced)
    return rec.spawned


def changed_actors(old: PlatformConfig, new: PlatformConfig) -> dict[str, tuple[type, dict[str, Any]]]:
    """The root actors whose spawn arguments differ (a ReplayError if the sets of actors differ)."""
    a, b = spawns(old), spawns(new)
    if set(a) != set(b):
        more = sorted(set(a) ^ set(b))
        raise ReplayError(f"--from: the change adds or removes actors ({', '.join(more[:4])}"
                          f"{', ...' if len(more) > 4 else ''}), which have no state at T to keep: "
                          "run the what-if from the start (without --from)")  # fmt: skip
    return {addr: b[addr] for addr in b if a[addr] != b[addr]}


def fork_tap(from_s: float, changes: dict[str, tuple[type, dict[str, Any]]], forked: list[str]) -> Any:
    """A per-delivery checker that, once everything due by `from_s` is delivered, rebuilds each
    changed live actor with its new arguments, keeping its state (`forked` learns which), and
    removes itself. (The kernel has no public peek at the next due time: `_next_time`.)"""

    def tap(driver: SimDriver) -> None:
        if driver._next_time() <= from_s:  # noqa: SLF001
            return
        for addr, (cls, kwargs) in sorted(changes.items()):
            cell = driver.cells.get(addr)
            if cell is None or not cell.alive or cell.actor is None:
                continue
            state = cell.actor.state
            cell.actor = cls(**kwargs)
            cell.actor.state = state
            forked.append(addr)
        driver.invariants.remove(tap)

    return tap
