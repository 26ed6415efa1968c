"""The recovery ladder's data (ladder.py decides): the `[recovery]` section, the recorded events,
the manager's state with a ladder on, its `evolve`, the actions beyond policy.py's, and where a
TE runs when the ladder moved it."""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.actors.ports.pod import TeSlot
from deepserve.core.messages import Event, Message

from . import policy as P
from .messages import DEVICE_LOST, HUNG
from .state import CmState

Rung = Literal["replace", "restart-world", "pd-separate", "substitute", "reroute"]
RUNGS: tuple[str, ...] = ("replace", "restart-world", "pd-separate", "substitute", "reroute")
Diagnosis = Literal["device-lost", "hang", "silent", "exited", "boot"]


class Recovery(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[recovery]` section: which rung of the ladder a failed TE takes."""

    rung: Rung = "replace"
    # empty servers beyond the layout: `substitute`'s spare pool (one substitute per server)
    spare_servers: int = msgspec.field(default=0)
    # the diagnoses that take a failed TE's node out of scheduling (Kubernetes' taint)
    taint: tuple[Diagnosis, ...] = (DEVICE_LOST, HUNG)  # type: ignore[assignment]
    # a tainted node is repaired (untainted) this long after (assumption: the papers give no
    # figure; 0: never within the run)
    node_repair_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 <= self.spare_servers <= 1024:
            raise ValueError(f"spare_servers: must be in [0, 1024], got {self.spare_servers}")
        if not 0 <= self.node_repair_s <= 86_400 * 365:
            raise ValueError(f"node_repair_s: must be in [0, 31536000], got {self.node_repair_s}")


# ---- recorded events (only when a rung other than `replace` is on) -------------------------------


class LadderChose(Event, frozen=True, kw_only=True):
    """The rung's decision for one failed TE generation: `action` in words, `tes` it touched."""

    te: str
    generation: int
    rung: str
    diagnosis: str
    action: str
    tes: tuple[str, ...] = ()


class NodeTainted(Event, frozen=True, kw_only=True):
    server: int
    reason: str


class TeRelocated(Event, frozen=True, kw_only=True):
    """The TE's next generation runs on these NPUs (another server's, or a stopped prefill's)."""

    te: str
    server: int
    npus: tuple[str, ...]
    why: str


class WorldRestarted(Event, frozen=True, kw_only=True):
    """Restart-the-world: `stopped` TEs of `model` relaunched, decode first; `queued` prefills wait
    for every decode to be ready."""

    model: str
    failed: str
    stopped: tuple[str, ...]
    queued: tuple[str, ...]


class WorldResumed(Event, frozen=True, kw_only=True):
    model: str
    launched: tuple[str, ...]


class TeTakenDown(Event, frozen=True, kw_only=True):
    """The ladder stopped `te` for want of healthy NPUs (its group shrunk by one): it comes back
    when a node is repaired."""

    te: str
    group: str


class TeBroughtBack(Event, frozen=True, kw_only=True):
    te: str
    group: str


class NodeRepaired(Event, frozen=True, kw_only=True):
    server: int


class TeScaledIn(Event, frozen=True, kw_only=True):
    """Decode vertical scaling: the TE's generation serves on without DP group `dp`."""

    te: str
    generation: int
    dp: int
    dps_left: int


class NodeRepairDue(Message, frozen=True, kw_only=True):
    """The manager's timer: the tainted node `server` is repaired."""

    server: int


EVENTS = (LadderChose, NodeTainted, TeRelocated, WorldRestarted, WorldResumed, NodeRepaired, TeTakenDown,
          TeBroughtBack, TeScaledIn)


class LadderState(CmState, kw_only=True):
    """The manager's state with a ladder on (a plain `CmState` otherwise: old logs' snapshots)."""

    tainted: dict[str, str] = {}  # str(server) -> why
    placed: dict[str, tuple[int, tuple[str, ...]]] = {}  # TE -> (server, NPUs) when not its own slot's
    queued: dict[str, list[str]] = {}  # model -> prefills waiting for its decodes (restart-the-world)
    down: dict[str, list[str]] = {}  # group -> TEs the ladder stopped and shrank it by
    scaled: dict[str, list[int]] = {}  # "te#generation" -> its DP groups dropped (vertical scaling)
    choices: int = 0


def evolve(s: LadderState, e: Event) -> LadderState:
    t = type(e)
    if t is LadderChose:
        s.choices += 1
    elif t is NodeTainted:
        s.tainted[str(e.server)] = e.reason  # type: ignore[attr-defined]
    elif t is TeRelocated:
        s.placed[e.te] = (e.server, e.npus)  # type: ignore[attr-defined]
    elif t is WorldRestarted:
        s.queued[e.model] = list(e.queued)  # type: ignore[attr-defined]
    elif t is WorldResumed:
        s.queued.pop(e.model, None)  # type: ignore[attr-defined]
    elif t is NodeRepaired:
        s.tainted.pop(str(e.server), None)  # type: ignore[attr-defined]
    elif t is TeScaledIn:
        s.scaled.setdefault(f"{e.te}#{e.generation}", []).append(e.dp)  # type: ignore[attr-defined]
    elif t is TeTakenDown:
        s.down.setdefault(e.group, []).append(e.te)  # type: ignore[attr-defined]
    elif t is TeBroughtBack:
        s.down[e.group].remove(e.te)  # type: ignore[attr-defined]
        if not s.down[e.group]:  # type: ignore[attr-defined]
            del s.down[e.group]  # type: ignore[attr-defined]
    return s


class Note(msgspec.Struct, frozen=True):
    """Record this event."""

    event: Event


class DropDp(msgspec.Struct, frozen=True):
    """Tell the TE's heartbeat responder to stop asking DP group `dp` (HbDropDp)."""

    te: str
    dp: int


class Flip(msgspec.Struct, frozen=True):
    """Move the ready TE to another group of its model (flip.py: membership only, no reload)."""

    te: str
    src: str
    dst: str
    reason: str


class Repair(msgspec.Struct, frozen=True):
    """Set the timer of the tainted node's repair."""

    server: int
    delay_s: float


Action = P.Action | Note | Repair | DropDp | Flip


# ---- placement -----------------------------------------------------------------------------------


def server_of(npu: str) -> int:
    """hw/s3/npu5 -> 3."""
    return int(npu.split("/")[1][1:])


def relocate(slot: TeSlot, npus: tuple[str, ...]) -> TeSlot:
    """The slot moved onto `npus` (as many or more than it has): its NPUs and host, in the slot
    and in every DP master's config, renamed."""
    moved = dict(zip(slot.npus, npus, strict=False))
    server = server_of(npus[0])
    host = f"hw/s{server}/host"
    moved[slot.host] = host

    def walk(v: object) -> object:
        if isinstance(v, str):
            return moved.get(v, v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return msgspec.structs.replace(slot, server=server, host=host, npus=npus[: len(slot.npus)],
                                   te_config=walk(slot.te_config))  # type: ignore[arg-type]  # fmt: skip


def slot_of(st: CmState, slot: TeSlot) -> TeSlot:
    """Where the TE runs now: its own slot, or where the ladder moved it."""
    placed = getattr(st, "placed", {}).get(slot.te)
    return slot if placed is None else relocate(slot, placed[1])


def _tainted(st: CmState, server: int) -> bool:
    return str(server) in getattr(st, "tainted", {})
