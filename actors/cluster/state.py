"""The cluster manager's recorded events, its state, and `evolve` (in place: the kernel rebuilds
from snapshot + events after a failed handler)."""

from __future__ import annotations

import msgspec

from deepserve.core.messages import Event

from .autoscaler_messages import FlipRefused, TeRoleFlipped
from .messages import BootStepName, TeStateName

MAX_HISTORY = 16  # a limit on everything: past generations kept per TE (for status)


class TeLaunching(Event, frozen=True, kw_only=True):
    te: str
    group: str
    generation: int
    pod_id: str
    source: str
    at_s: float
    replacing: bool = False  # a replacement of a failed generation (state "replacing")


class TePodUp(Event, frozen=True, kw_only=True):
    te: str
    generation: int
    endpoint: str
    duration_s: float


class TeStepDone(Event, frozen=True, kw_only=True):
    te: str
    generation: int
    step: BootStepName
    duration_s: float
    detail: str = ""


class TeReady(Event, frozen=True, kw_only=True):
    te: str
    group: str
    generation: int
    at_s: float


class TeDeclaredFailed(Event, frozen=True, kw_only=True):
    te: str
    generation: int
    reason: str
    at_s: float
    diagnosis: str = ""  # messages.DIAGNOSES: crash (device lost) vs hang vs silent vs exited vs boot


class TeBootBackoff(Event, frozen=True, kw_only=True):
    """The failed generation's slot boots again at `retry_at_s` (policy.BootBackoff), not at once:
    its boot failed `failures` times in a row."""

    te: str
    generation: int
    failures: int
    delay_s: float
    retry_at_s: float


class TeDraining(Event, frozen=True, kw_only=True):
    te: str
    generation: int
    reason: str
    at_s: float


class TeStopped(Event, frozen=True, kw_only=True):
    te: str
    generation: int
    reason: str
    at_s: float


class DrainProbed(Event, frozen=True, kw_only=True):
    """A draining TE's DP master answered: `busy` tasks (waiting + running) left on it."""

    te: str
    dp: int
    busy: int


class OwnerCancelled(Event, frozen=True, kw_only=True):
    """A lost JE's tasks: `CancelOwner` sent to each TE that may run some (ready or draining)."""

    owner: str
    reason: str
    tes: tuple[str, ...]


class GroupTarget(Event, frozen=True, kw_only=True):
    group: str
    model: str
    role: str
    size: int


class ScaleRefused(Event, frozen=True, kw_only=True):
    group: str
    size: int
    reason: str


class MembershipPushed(Event, frozen=True, kw_only=True):
    group: str
    tes: tuple[str, ...]
    draining: tuple[str, ...]


class DirectoryChanged(Event, frozen=True, kw_only=True):
    routes: dict[str, str]  # entries set
    removed: tuple[str, ...] = ()


class TeRecord(msgspec.Struct, kw_only=True):
    te: str
    group: str
    generation: int
    state: TeStateName
    pod_id: str
    source: str
    launched_s: float
    since_s: float  # when it entered `state`
    endpoint: str = ""
    steps: dict[str, float] = {}  # this generation's boot steps: name -> duration (s)
    details: dict[str, str] = {}
    reason: str = ""
    failures: int = 0  # generations declared failed so far
    boot_failures: int = 0  # consecutive generations that failed before registering
    retry_at_s: float | None = None  # failed, waiting out a boot backoff: when the next boot starts
    drain_busy: dict[str, int] = {}  # draining: str(dp) -> tasks left at its last probe
    history: list[dict[str, object]] = []  # past generations: {generation, state, reason, steps}


class GroupRecord(msgspec.Struct, kw_only=True):
    model: str
    role: str
    target: int = 0


class CmState(msgspec.Struct, kw_only=True):
    tes: dict[str, TeRecord] = {}
    groups: dict[str, GroupRecord] = {}
    directory: dict[str, str] = {}
    dir_version: int = 0
    version: int = 0  # membership pushes so far (the version JEs see)
    launches: int = 0
    failures: int = 0
    refusals: int = 0
    owners_cancelled: int = 0  # lost JEs whose tasks the TEs were told to cancel


def evolve(s: CmState, e: Event) -> CmState:
    t = type(e)
    if t is TeLaunching:
        _launching(s, e)  # type: ignore[arg-type]
    elif t is TePodUp:
        r = s.tes[e.te]  # type: ignore[attr-defined]
        r.endpoint = e.endpoint  # type: ignore[attr-defined]
        r.steps["pod_start"] = e.duration_s  # type: ignore[attr-defined]
    elif t is TeStepDone:
        r = s.tes[e.te]  # type: ignore[attr-defined]
        r.steps[e.step] = e.duration_s  # type: ignore[attr-defined]
        if e.detail:  # type: ignore[attr-defined]
            r.details[e.step] = e.detail  # type: ignore[attr-defined]
    elif t is TeReady:
        if e.te not in s.tes:  # type: ignore[attr-defined]
            # a TE that registered without a launch (a simulation's builder spawned it)
            s.tes[e.te] = TeRecord(te=e.te, group=e.group, generation=e.generation, state="ready",  # type: ignore[attr-defined]
                                   pod_id="", source="resident", launched_s=e.at_s, since_s=e.at_s)  # type: ignore[attr-defined]
        _enter(s.tes[e.te], "ready", e.at_s)  # type: ignore[attr-defined]
        s.tes[e.te].boot_failures = 0  # type: ignore[attr-defined]
    elif t is TeDeclaredFailed:
        r = s.tes[e.te]  # type: ignore[attr-defined]
        r.boot_failures = r.boot_failures + 1 if r.state in ("starting", "replacing") else 0
        _enter(r, "failed", e.at_s, e.reason)  # type: ignore[attr-defined]
        r.failures += 1
        s.failures += 1
    elif t is TeBootBackoff:
        s.tes[e.te].retry_at_s = e.retry_at_s  # type: ignore[attr-defined]
    elif t is TeDraining:
        _enter(s.tes[e.te], "draining", e.at_s, e.reason)  # type: ignore[attr-defined]
    elif t is TeStopped:
        _enter(s.tes[e.te], "stopped", e.at_s, e.reason)  # type: ignore[attr-defined]
        s.tes[e.te].retry_at_s = None  # type: ignore[attr-defined]
    elif t is GroupTarget:
        g = s.groups.setdefault(e.group, GroupRecord(model=e.model, role=e.role))  # type: ignore[attr-defined]
        g.target = e.size  # type: ignore[attr-defined]
    elif t is DrainProbed:
        s.tes[e.te].drain_busy[str(e.dp)] = e.busy  # type: ignore[attr-defined]
    elif t is OwnerCancelled:
        s.owners_cancelled += 1
    elif t is ScaleRefused:
        s.refusals += 1
    elif t is MembershipPushed:
        s.version += 1
    elif t is TeRoleFlipped:
        s.tes[e.te].group = e.dst  # type: ignore[attr-defined]
    elif t is FlipRefused:
        s.refusals += 1
    elif t is DirectoryChanged:
        s.directory.update(e.routes)  # type: ignore[attr-defined]
        for k in e.removed:  # type: ignore[attr-defined]
            s.directory.pop(k, None)
        s.dir_version += 1
    else:
        raise ValueError(f"cluster manager: unknown event {t.__name__}")
    return s


def _enter(r: TeRecord, state: TeStateName, at_s: float, reason: str = "") -> None:
    r.state, r.since_s = state, at_s
    if reason:
        r.reason = reason


def _launching(s: CmState, e: TeLaunching) -> None:
    old = s.tes.get(e.te)
    rec = TeRecord(te=e.te, group=e.group, generation=e.generation, state="replacing" if e.replacing else "starting",
                   pod_id=e.pod_id, source=e.source, launched_s=e.at_s, since_s=e.at_s)  # fmt: skip
    if old is not None:
        rec.failures, rec.boot_failures = old.failures, old.boot_failures
        past: dict[str, object] = {"generation": old.generation, "state": old.state, "reason": old.reason, "steps": dict(old.steps)}
        rec.history = [*old.history, past][-MAX_HISTORY:]
    s.tes[e.te] = rec
    s.launches += 1
