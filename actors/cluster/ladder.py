"""The recovery ladder (xDeepServe §6.2 stages 1–2, P/D-Serve §3.4): what the cluster manager
does when a serving TE is declared failed, as a selectable policy (`Recovery.rung`, the config's
`[recovery]` section), pure — the manager records and carries out the actions.

- `replace` (the default, what the platform always did): the failed TE alone is replaced in its
  own slot through the cold path; its new pod re-initialises the NPUs. No ladder event is
  recorded, so a run without `[recovery]` logs exactly what it logged before.
- `restart-world` (stage 1, small clusters): every TE of the failed TE's model is stopped and
  relaunched; decode TEs first, prefill TEs once every decode is ready again. A decode whose node
  is tainted takes a prefill's NPUs (a degraded cluster still runs its decode), that prefill is
  not restarted.
- `pd-separate` (stage 2): only the failed TE is touched — a failed prefill never takes a decode
  down. A decode of several DP groups whose one group lost its device scales in vertically: it
  serves on with the others, which keep their requests (the lost group's fail over; its
  heartbeat responder stops asking it). On a tainted node a prefill (or colocated TE) stays
  down; a decode is kept alive by kill-P-to-preserve-D: one prefill is stopped and the decode
  relaunched on its NPUs.
- `reroute` (xDeepServe §6.2, P/D-Serve §3.4; with KV link routing, kvpaths.py): a TE whose RoCE
  NIC link probing found dead, its NPUs fine, is not replaced: it moves to its model's colocated
  group (a role flip, no reload) and serves whole requests, which need no KV link, until its NIC
  carries data again, then moves back (`on_kv_verdict`). A TE declared failed is substituted.
- `substitute` (P/D-Serve §3.4, minimum-cost): only the failed TE is replaced, in place when its
  node is healthy, else by one new instance on a spare server (`spare_servers`, empty servers
  beyond the layout) under the same address; it enters the JEs' membership (their routing) only
  once it registered, so no request reaches it before it can serve.

A node is tainted (Kubernetes marks it unschedulable) when a TE fails with a diagnosis in
`Recovery.taint` — by default a lost or hung device, not a process that exited or went silent —
and repaired `node_repair_s` later (untainted, `NodeRepaired`): then the TEs the ladder took
down come back, on their own NPUs or on ones a moved TE left free, and their groups' targets
with them.
Every rung but `replace` records its choice per failure (`LadderChose`), with the taint and any
move (`NodeTainted`, `TeRelocated`), so the same fault under two rungs compares in `replay`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from deepserve.actors.je.kvlinks import HEALTHY, LINK_FAULT, KvLinkVerdict
from deepserve.actors.ports.pod import LoadSource, TeSlot

from . import policy as P
from .ladder_state import (  # noqa: F401 (re-exported: the ladder's one import)
    EVENTS,
    RUNGS,
    Action,
    Diagnosis,
    DropDp,
    Flip,
    LadderChose,
    LadderState,
    NodeRepairDue,
    NodeRepaired,
    NodeTainted,
    Note,
    Recovery,
    Repair,
    Rung,
    TeBroughtBack,
    TeRelocated,
    TeScaledIn,
    TeTakenDown,
    WorldRestarted,
    WorldResumed,
    _tainted,
    evolve,
    relocate,
    server_of,
    slot_of,
)
from .messages import DEVICE_LOST
from .state import CmState, GroupTarget

# ---- decisions -----------------------------------------------------------------------------------


def on_failed(st: CmState, slots: Mapping[str, TeSlot], cfg: Recovery, spares: tuple[int, ...], te: str,
              generation: int, reason: str, diagnosis: str, source: LoadSource,
              backoff: P.BootBackoff) -> list[Action]:  # fmt: skip
    """A TE generation declared failed, under `cfg.rung`. Boot failures, stale declarations and
    surplus TEs go the default way (`policy.on_te_failed`); so does every failure under `replace`."""
    base: list[Action] = list(P.on_te_failed(st, te, generation, reason, source, diagnosis, backoff))
    r = st.tes.get(te)
    if cfg.rung == "replace" or not base or r is None or r.state != "ready" or te not in slots:
        return base
    if not isinstance(base[-1], P.Launch):  # the group no longer wants it: stopped, nothing to choose
        return base
    head, here = base[:3], slot_of(st, slots[te])
    if cfg.rung == "pd-separate" and (scaled := _scale_in(st, here, generation, reason, diagnosis)):
        return scaled
    out: list[Action] = list(head)
    taint = diagnosis in cfg.taint and not _tainted(st, here.server)
    if taint:
        out.append(Note(NodeTainted(server=here.server, reason=f"{te} failed: {diagnosis} ({reason})")))
        if cfg.node_repair_s > 0:
            out.append(Repair(here.server, cfg.node_repair_s))
    gone = taint or _tainted(st, here.server)
    if cfg.rung == "restart-world":
        return out + _restart_world(st, slots, te, generation, diagnosis, gone, source)
    if cfg.rung == "pd-separate":
        return out + _pd_separate(st, slots, te, generation, diagnosis, gone, source)
    return out + _substitute(st, slots, spares, te, generation, diagnosis, gone, source, cfg.rung)


def _chose(te: str, generation: int, rung: str, diagnosis: str, action: str, tes: tuple[str, ...] = ()) -> Note:
    return Note(LadderChose(te=te, generation=generation, rung=rung, diagnosis=diagnosis, action=action, tes=tes))


def _in_place(te: str, generation: int, rung: str, diagnosis: str, source: LoadSource) -> list[Action]:
    why = f"generation {generation} failed"
    return [_chose(te, generation, rung, diagnosis, "replaced in place: its node is healthy, no other TE touched"),
            P.StopPodOnly(te, why), P.Launch(te, generation + 1, source, replacing=True)]  # fmt: skip


def _shrink(st: CmState, te: str, group: str) -> list[Action]:
    """`te` taken down for want of NPUs: its group one smaller until its node is repaired."""
    g = st.groups[group]
    return [Note(GroupTarget(group=group, model=g.model, role=g.role, size=max(g.target - 1, 0))),
            Note(TeTakenDown(te=te, group=group))]  # fmt: skip


def _down(st: CmState, slot: TeSlot, generation: int, rung: str, diagnosis: str, why: str) -> list[Action]:
    return [_chose(slot.te, generation, rung, diagnosis, why), *_shrink(st, slot.te, slot.group),
            P.Stop(slot.te, f"generation {generation} failed: {why}")]  # fmt: skip


def _scale_in(st: CmState, slot: TeSlot, generation: int, reason: str, diagnosis: str) -> list[Action]:
    """Decode vertical scaling: a decode TE whose one DP group's device is lost (the heartbeat
    answer names its master) serves on with the others; [] when that does not apply."""
    if slot.role != "decode" or slot.dp_groups < 2 or diagnosis != DEVICE_LOST:
        return []
    m = re.search(rf"{re.escape(slot.te)}/dp/(\d+)\b", reason)
    lost = getattr(st, "scaled", {}).get(f"{slot.te}#{generation}", [])
    if m is None or int(m.group(1)) in lost or int(m.group(1)) >= slot.dp_groups:
        return []
    dp, left = int(m.group(1)), slot.dp_groups - len(lost) - 1
    if left < 1:
        return []
    why = (f"decode vertical scaling: {slot.te} serves on with {left} of {slot.dp_groups} DP groups "
           f"(dp/{dp}'s device lost; the other groups keep their requests)")  # fmt: skip
    return [_chose(slot.te, generation, "pd-separate", diagnosis, why),
            Note(TeScaledIn(te=slot.te, generation=generation, dp=dp, dps_left=left)),
            DropDp(slot.te, dp), P.Watch(slot.te, generation)]  # fmt: skip


def _victim(st: CmState, slots: Mapping[str, TeSlot], model: str, need: int) -> TeSlot | None:
    """The prefill TE kill-P-to-preserve-D stops: the last ready one on a healthy node with NPUs
    enough for the decode."""
    found = [slot_of(st, slots[t]) for t, r in sorted(st.tes.items()) if t in slots and r.state == "ready"
             and slots[t].model == model and slots[t].role == "prefill"]  # fmt: skip
    fit = [s for s in found if not _tainted(st, s.server) and len(s.npus) >= need]
    return fit[-1] if fit else None


def _pd_separate(st: CmState, slots: Mapping[str, TeSlot], te: str, generation: int, diagnosis: str,
                 gone: bool, source: LoadSource) -> list[Action]:  # fmt: skip
    if not gone:
        return _in_place(te, generation, "pd-separate", diagnosis, source)
    here = slot_of(st, slots[te])
    if here.role != "decode":
        return _down(st, here, generation, "pd-separate", diagnosis,
                     f"its node s{here.server} is tainted: the {here.role} TE stays down, no decode touched")
    victim = _victim(st, slots, here.model, len(here.npus))
    if victim is None:
        return _down(st, here, generation, "pd-separate", diagnosis,
                     f"its node s{here.server} is tainted and no prefill TE can give it its NPUs")
    why = f"kill-P-to-preserve-D: {victim.te}'s NPUs on s{victim.server} host decode {te}"
    return [_chose(te, generation, "pd-separate", diagnosis, why, (victim.te,)),
            *_shrink(st, victim.te, victim.group), P.Stop(victim.te, why),
            Note(TeRelocated(te=te, server=victim.server, npus=victim.npus, why=why)),
            P.StopPodOnly(te, f"generation {generation} failed"), P.Launch(te, generation + 1, source, replacing=True)]  # fmt: skip


def _substitute(st: CmState, slots: Mapping[str, TeSlot], spares: tuple[int, ...], te: str, generation: int,
                diagnosis: str, gone: bool, source: LoadSource, rung: str = "substitute") -> list[Action]:  # fmt: skip
    if not gone:
        return _in_place(te, generation, rung, diagnosis, source)
    here = slot_of(st, slots[te])
    used = {server for server, _ in getattr(st, "placed", {}).values()}
    free = [s for s in spares if s not in used and not _tainted(st, s)]
    if not free:
        return _down(st, here, generation, "substitute", diagnosis,
                     f"its node s{here.server} is tainted and the spare pool is empty")
    npus = tuple(f"hw/s{free[0]}/{n.split('/', 2)[2]}" for n in here.npus)
    why = f"substituted on spare server s{free[0]}: its node s{here.server} is tainted"
    return [_chose(te, generation, rung, diagnosis, why),
            Note(TeRelocated(te=te, server=free[0], npus=npus, why=why)),
            P.StopPodOnly(te, f"generation {generation} failed"), P.Launch(te, generation + 1, source, replacing=True)]  # fmt: skip


def _restart_world(st: CmState, slots: Mapping[str, TeSlot], te: str, generation: int, diagnosis: str,
                   gone: bool, source: LoadSource) -> list[Action]:  # fmt: skip
    """Stop every TE of the model, relaunch decode (and colocated) TEs now, prefills later."""
    model = slots[te].model
    world = [t for t, r in sorted(st.tes.items()) if t in slots and slots[t].model == model and r.state in P.ACTIVE]
    why = f"restart-the-world: {te} failed ({diagnosis})"
    out: list[Action] = []
    others = tuple(t for t in world if t != te)
    out += [P.Stop(t, why) for t in others]
    here = {t: slot_of(st, slots[t]) for t in world}
    first = [t for t in world if slots[t].role != "prefill"]
    prefills = [t for t in world if slots[t].role == "prefill"]
    taken: list[str] = []  # prefills whose NPUs a decode on a tainted node takes
    for t in first:
        if t == te and gone:
            free = [p for p in reversed(prefills) if p not in taken and not _tainted(st, here[p].server)
                    and len(here[p].npus) >= len(here[t].npus)]  # fmt: skip
            if not free:
                out += _shrink(st, t, slots[t].group)
                first = [x for x in first if x != t]
                continue
            taken.append(free[0])
            out.append(Note(TeRelocated(te=t, server=here[free[0]].server, npus=here[free[0]].npus,
                                        why=f"restart-the-world, decode first: on {free[0]}'s NPUs")))  # fmt: skip
    for p in taken:
        out += _shrink(st, p, slots[p].group)
    left = [p for p in prefills if p not in taken and not (p == te and gone)]
    if te in prefills and gone:
        out += _shrink(st, te, slots[te].group)
    what = (f"stopped {len(world)} TEs of {model}; decode first ({', '.join(first) or 'none'}), then prefill "
            f"({', '.join(left) or 'none'})" + (f"; {', '.join(taken)} gave its NPUs to a decode" if taken else ""))
    out.insert(0, _chose(te, generation, "restart-world", diagnosis, what, tuple(world)))
    out.append(Note(WorldRestarted(model=model, failed=te, stopped=tuple(world), queued=tuple(left if first else ()))))
    back = te in first or te in left
    # the failed TE's pod goes; it stays `failed` until relaunched, or is stopped for good
    out.append(P.StopPodOnly(te, f"generation {generation} failed") if back else P.Stop(te, why))
    gens = {t: st.tes[t].generation + 1 for t in world}
    launch = first if first else left  # a prefill-only world has nothing to wait for
    out += [P.Launch(t, gens[t], source, replacing=True) for t in launch]
    return out


def on_kv_verdict(st: CmState, slots: Mapping[str, TeSlot], cfg: Recovery, v: KvLinkVerdict) -> list[Action]:
    """`reroute` (xDeepServe §6.2, P/D-Serve §3.4): a TE whose RoCE NIC is dead while its NPUs are
    fine is not replaced (a new pod on the same node keeps the dead NIC; the JEs already stop
    pairing over it). A P/D TE reaches no peer without it (its group's TEs are on other servers),
    so it moves to its model's colocated group — membership only, as a role flip: it serves whole
    requests, which need no KV link — and back to its own group once its NIC carries data again.
    Other rungs: nothing (the JEs' routing alone)."""
    if cfg.rung != "reroute":
        return []
    if v.verdict == LINK_FAULT and v.nic_te in slots:
        return _nic_down(st, slots[v.nic_te], v)
    if v.verdict == HEALTHY:
        return [a for te in dict.fromkeys((v.src_te, v.dst_te)) if te in slots for a in _nic_back(st, slots[te], v)]
    return []


def _nic_down(st: CmState, slot: TeSlot, v: KvLinkVerdict) -> list[Action]:
    r, colocated = st.tes.get(slot.te), P.group_of(slot.model, "colocated")
    if r is None or r.state != "ready" or slot.role == "colocated" or r.group != slot.group:
        return []  # not serving, needs no KV link, or moved already
    why = (f"its RoCE NIC {v.link} is dead, its NPUs are fine: not replaced; it serves whole requests in "
           f"{colocated} (no KV link) until the NIC carries data again")  # fmt: skip
    out: list[Action] = [_chose(slot.te, r.generation, "reroute", "link-fault", why, (slot.te,))]
    if colocated not in st.groups:
        out.append(Note(GroupTarget(group=colocated, model=slot.model, role="colocated", size=0)))
    return [*out, Flip(slot.te, r.group, colocated, f"reroute: NIC {v.link} dead")]


def _nic_back(st: CmState, slot: TeSlot, v: KvLinkVerdict) -> list[Action]:
    r, colocated = st.tes.get(slot.te), P.group_of(slot.model, "colocated")
    if r is None or r.state != "ready" or slot.role == "colocated" or r.group != colocated:
        return []
    why = f"its KV path {v.src_te}->{v.dst_te} carries data again: back to {slot.group}"
    return [_chose(slot.te, r.generation, "reroute", "link-healthy", why, (slot.te,)),
            Flip(slot.te, colocated, slot.group, "reroute: NIC healthy")]  # fmt: skip


def on_ready(st: CmState, slots: Mapping[str, TeSlot], te: str, source: LoadSource = "cold") -> list[Action]:
    """A TE is ready: restart-the-world's queued prefills launch once no decode of theirs boots."""
    queued = getattr(st, "queued", {})
    slot = slots.get(te)
    if slot is None or slot.model not in queued:
        return []
    booting = [t for t, r in st.tes.items() if t in slots and slots[t].model == slot.model
               and slots[t].role != "prefill" and r.state in ("starting", "replacing")]  # fmt: skip
    if booting:
        return []
    tes = tuple(queued[slot.model])
    return [Note(WorldResumed(model=slot.model, launched=tes)),
            *(P.Launch(t, st.tes[t].generation + 1, source, replacing=True) for t in tes)]  # fmt: skip


def on_repaired(st: CmState, slots: Mapping[str, TeSlot], server: int, source: LoadSource = "cold") -> list[Action]:
    """A tainted node is repaired: every TE the ladder took down comes back where NPUs are free and
    healthy — its own slot's, else those a moved TE left (as many) — and its group grows again."""
    if not _tainted(st, server):
        return []
    out: list[Action] = [Note(NodeRepaired(server=server))]
    healthy = {s: not _tainted(st, s) or s == server for s in {sl.server for sl in slots.values()}}
    busy = {n for t, r in st.tes.items() if t in slots and r.state != "stopped" for n in slot_of(st, slots[t]).npus}
    homes = [slots[t].npus for t in sorted(getattr(st, "placed", {})) if t in slots]  # left by a moved TE
    grown: dict[str, int] = {}
    for group, tes in sorted(getattr(st, "down", {}).items()):
        for te in tes:
            if st.tes[te].state != "stopped":
                continue
            own = slots[te].npus
            free = [n for n in (own, *homes) if len(n) == len(own) and not busy & set(n)
                    and healthy.get(server_of(n[0]), False)]  # fmt: skip
            if not free:
                continue
            busy |= set(free[0])
            g = st.groups[group]
            grown[group] = grown.get(group, 0) + 1
            out += [Note(GroupTarget(group=group, model=g.model, role=g.role, size=g.target + grown[group])),
                    Note(TeBroughtBack(te=te, group=group)),
                    Note(TeRelocated(te=te, server=server_of(free[0][0]), npus=free[0],
                                     why=f"back after node s{server}'s repair")),
                    P.Launch(te, st.tes[te].generation + 1, source, replacing=True)]  # fmt: skip
    return out


def blocked_slots(st: CmState, slots: tuple[TeSlot, ...]) -> frozenset[str]:
    """Slots a scale-up must not launch on: their TE is not running and their NPUs host a TE the
    ladder moved there, or their node is tainted (empty without a ladder)."""
    placed = getattr(st, "placed", {})
    if not placed and not getattr(st, "tainted", {}):
        return frozenset()
    busy = {n for t, (_, npus) in placed.items() if t in st.tes and st.tes[t].state != "stopped" for n in npus}
    idle = [s for s in slots if s.te not in st.tes or st.tes[s.te].state == "stopped"]
    return frozenset(s.te for s in idle if busy & set(s.npus) or _tainted(st, s.server))
