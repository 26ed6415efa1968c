"""The cluster manager's decisions, pure: what to do on a failed TE, on a scale request, on a
registration — as a list of actions the actor carries out (records, pushes, pod commands).

The recovery ladder (xDeepServe §6.2: restart, P/D separate failover, token recomputation) and
the scaling pipeline (pre-warmed pods and TEs, DRAM pre-loading, NPU-fork) slot in here as more
actions or another `source` for `Launch`, without touching the actor.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.pod import LoadSource, TeSlot

from .state import CmState

ACTIVE = ("starting", "replacing", "ready")  # count toward a group's target


class Launch(msgspec.Struct, frozen=True):
    te: str
    generation: int
    source: LoadSource
    replacing: bool = False


class Fail(msgspec.Struct, frozen=True):
    te: str
    generation: int
    reason: str
    diagnosis: str = ""  # messages.DIAGNOSES


class Stop(msgspec.Struct, frozen=True):
    """Stop the TE's pod and mark it stopped."""

    te: str
    reason: str


class StopPodOnly(msgspec.Struct, frozen=True):
    """Stop a failed generation's pod (its record stays `failed` until the replacement starts)."""

    te: str
    reason: str


class Drain(msgspec.Struct, frozen=True):
    te: str
    reason: str


class Push(msgspec.Struct, frozen=True):
    group: str


class Watch(msgspec.Struct, frozen=True):
    te: str
    generation: int


class Unwatch(msgspec.Struct, frozen=True):
    te: str


class Ready(msgspec.Struct, frozen=True):
    te: str
    generation: int


class Refuse(msgspec.Struct, frozen=True):
    reason: str


class Backoff(msgspec.Struct, frozen=True):
    """Relaunch the slot of a generation whose boot failed, after `delay_s` (`on_relaunch`)."""

    te: str
    generation: int  # the failed generation
    failures: int  # consecutive failed boots, this one included
    delay_s: float


Action = Launch | Fail | Stop | StopPodOnly | Drain | Push | Watch | Unwatch | Ready | Refuse | Backoff


class BootBackoff(msgspec.Struct, frozen=True):
    """The wait between a failed boot and the next one on the slot (Kubernetes' CrashLoopBackOff):
    the first retry at once (a one-off — a killed process, a read error — costs nothing), then
    `base_s`, doubled per further failure, capped at `max_s`. Retries never end while the group
    wants the TE (the cause — a link down, a flapping PCIe — may clear at any time and nobody
    tells the manager), but a slot that can never boot costs one boot every `max_s`, no more."""

    base_s: float = 1.0
    max_s: float = 30.0

    def delay_s(self, failures: int) -> float:
        if failures <= 1 or self.max_s <= 0:
            return 0.0
        return min(self.base_s * 2.0 ** min(failures - 2, 62), self.max_s)


NO_BACKOFF = BootBackoff(base_s=0.0, max_s=0.0)


def group_of(model: str, role: str) -> str:
    return f"{model}/{role}"


def active(st: CmState, group: str) -> list[str]:
    return sorted(te for te, r in st.tes.items() if r.group == group and r.state in ACTIVE)


def membership(st: CmState, group: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ready TEs, draining TEs) of the group: what the JEs route to / must not fail over."""
    ready = tuple(sorted(te for te, r in st.tes.items() if r.group == group and r.state == "ready"))
    draining = tuple(sorted(te for te, r in st.tes.items() if r.group == group and r.state == "draining"))
    return ready, draining


def free_slots(st: CmState, slots: tuple[TeSlot, ...], group: str) -> list[TeSlot]:
    """The group's slots that hold no live TE (never used, or stopped)."""
    return [s for s in slots if s.group == group and (s.te not in st.tes or st.tes[s.te].state == "stopped")]


def next_generation(st: CmState, te: str) -> int:
    r = st.tes.get(te)
    return 1 if r is None else r.generation + 1


def on_te_failed(st: CmState, te: str, generation: int, reason: str, replace_source: LoadSource = "cold",
                 diagnosis: str = "", backoff: BootBackoff = NO_BACKOFF) -> list[Action]:  # fmt: skip
    """A TE generation is declared failed: out of its group (a push, so the JEs fail over its
    open tasks), its pod stopped, and a replacement launched when the group still wants it —
    at once, or, when this generation failed to boot, after `backoff`'s wait (`Backoff`)."""
    r = st.tes.get(te)
    if r is None or r.generation != generation or r.state in ("failed", "stopped"):
        return []  # stale: an older generation, or already handled
    out: list[Action] = [Fail(te, generation, reason, diagnosis), Unwatch(te)]
    if r.state in ("ready", "draining"):
        out.append(Push(r.group))
    g = st.groups.get(r.group)
    wanted = g is not None and len(active(st, r.group)) - (r.state in ACTIVE) < g.target
    if r.state == "draining" or not wanted:
        out.append(Stop(te, f"generation {generation} failed: {reason}"))
        return out
    out.append(StopPodOnly(te, f"generation {generation} failed: {reason}"))
    booting = r.state in ("starting", "replacing")
    delay_s = backoff.delay_s(r.boot_failures + 1) if booting else 0.0
    if delay_s > 0:
        out.append(Backoff(te, generation, r.boot_failures + 1, delay_s))
    else:
        out.append(Launch(te, generation + 1, replace_source, replacing=True))
    return out


def on_relaunch(st: CmState, te: str, generation: int, replace_source: LoadSource = "cold") -> list[Action]:
    """A failed boot's wait is over: the next generation boots if the group still wants it
    (a scale-down in between, or another slot launched, may have made it surplus)."""
    r = st.tes.get(te)
    if r is None or r.generation != generation or r.state != "failed":
        return []  # stale: stopped, removed or relaunched meanwhile
    g = st.groups.get(r.group)
    if g is None or len(active(st, r.group)) >= g.target:
        return [Stop(te, f"not relaunched: its group {r.group} is at its target")]
    return [Launch(te, generation + 1, replace_source, replacing=True)]


def on_registered(st: CmState, te: str) -> list[Action]:
    r = st.tes.get(te)
    if r is None or r.state not in ("starting", "replacing"):
        return []
    return [Ready(te, r.generation), Push(r.group), Watch(te, r.generation)]


def on_scale(st: CmState, slots: tuple[TeSlot, ...], group: str, size: int, source: LoadSource = "cold",
             blocked: frozenset[str] = frozenset()) -> list[Action]:  # fmt: skip
    """Set the group's size: launch on free slots, or drain (starting TEs are stopped first).
    `blocked`: free slots not to launch on (the recovery ladder's: their NPUs host a moved TE or
    their node is tainted)."""
    ours = [s for s in slots if s.group == group]
    if group not in st.groups or not ours:
        known = sorted({s.group for s in slots} | set(st.groups))
        return [Refuse(f"group: no TE group {group!r}; groups: {', '.join(known) or 'none'}")]
    if not 0 <= size <= len(ours):
        return [Refuse(f"size: must be in [0, {len(ours)}] (the group's TE slots), got {size}")]
    act = active(st, group)
    if size > len(act):
        free = [s for s in free_slots(st, slots, group) if s.te not in blocked][: size - len(act)]
        return [Launch(s.te, next_generation(st, s.te), source) for s in free]
    out: list[Action] = []
    booting = [te for te in act if st.tes[te].state != "ready"]
    ready = [te for te in act if st.tes[te].state == "ready"]
    victims = (list(reversed(booting)) + list(reversed(ready)))[: len(act) - size]
    for te in victims:
        if st.tes[te].state == "ready":
            out.append(Drain(te, f"scale {group} to {size}"))
        else:
            out.append(Stop(te, f"scale {group} to {size}: stopped while booting"))
    if any(isinstance(a, Drain) for a in out):
        out.append(Push(group))
    return out


def drain_finished(waiting: int, running: int, elapsed_s: float, timeout_s: float) -> str | None:
    """Why a draining TE may stop now (None: keep waiting)."""
    if waiting == 0 and running == 0:
        return "drained: no task left"
    if elapsed_s >= timeout_s:
        return f"drain timeout after {timeout_s:g}s ({waiting} waiting, {running} running)"
    return None


# ---- heartbeats (the monitor's decision) ---------------------------------------------------------


class Watched(msgspec.Struct, kw_only=True):
    """The monitor's view of one TE: the last heartbeat sent, the last acknowledged, misses."""

    generation: int
    sent: int = 0  # seq of the last heartbeat sent (0: none yet)
    acked: int = 0  # seq of the last heartbeat answered ok
    misses: int = 0  # consecutive
    reason: str = ""  # the last nack's reason
    diagnosis: str = ""  # the last nack's diagnosis (messages.DIAGNOSES)
    lease_until: float = 0.0  # leased (heartbeat.py): not asked before then, unless broken


class TickOutcome(msgspec.Struct, frozen=True):
    missed: tuple[tuple[str, int, str], ...]  # (te, consecutive misses, why)
    failed: tuple[tuple[str, int, str], ...]  # (te, generation, reason): declared failed now
    ping: tuple[str, ...]  # TEs to send the next heartbeat to


def heartbeat_tick(watched: dict[str, Watched], misses_limit: int, interval_s: float,
                   now: float = 0.0) -> TickOutcome:  # fmt: skip
    """At a tick: a TE whose last heartbeat is unanswered missed one; `misses_limit` in a row
    and it is declared failed (and no longer pinged); a TE whose lease runs past `now` is left
    alone (its last answer was ok and its devices promised word of any fault); every other TE
    gets the next heartbeat."""
    missed, failed, ping = [], [], []
    for te in sorted(watched):
        w = watched[te]
        if w.lease_until > now:
            continue
        if w.sent and w.acked < w.sent:
            n = w.misses + 1
            why = w.reason or f"no answer within {interval_s:g}s"
            missed.append((te, n, why))
            if n >= misses_limit:
                said = "1 heartbeat missed" if n == 1 else f"{n} heartbeats missed in a row"
                failed.append((te, w.generation, f"{said} (last: {why})"))
                continue
        ping.append(te)
    return TickOutcome(tuple(missed), tuple(failed), tuple(ping))
