"""The cluster manager acting on the per-host device-health monitors' levels (P/D-Serve §3.4:
"the faults are classified into multiple levels, in which some are recoverable without
node-level recovery"; issue 33 §1), under `cluster.resilience.device_health` (health.py's
`HealthAlert`s; a plain `HealthReport` is left alone):

- recoverable in place (a transient link error, a masked part of KV HBM, a saturated KV path):
  recorded, nothing done — token recomputation, masking and routing handle them where they are;
- instance (a crashed or hung NPU, a region the TE cannot do without): the TE serving on that
  NPU is declared failed, if it is not already, with the diagnosis the heartbeats would have
  given (`device-lost`, `hang`), and the recovery ladder runs as for any failure. A blocked KV
  link is not acted on: its verdict names a path, not which end is at fault (kvpaths.py and the
  JEs' routing act on it), and replacing the decode it was attributed to would replace a TE
  whose own devices are fine;
- node (`node_fraction` of its NPUs at instance level): the node is tainted (with its repair
  after `recovery.node_repair_s`), so the ladder places replacements elsewhere; the monitor
  reports it before the device that took it there. The default rung, `replace`, has no taint:
  recorded only.

Each report is recorded with what was done (`HealthActed`), so `replay` shows why a TE was
replaced before any heartbeat said so.
"""

from __future__ import annotations

from typing import Any

from deepserve.core import Context, Event

from . import ladder as L
from .health import INSTANCE, NODE, RECOVERABLE, HealthAlert
from .messages import DEVICE_LOST, HUNG

DIAGNOSES = {"crash": DEVICE_LOST, "hbm-fault": DEVICE_LOST, "hang": HUNG}  # instance kinds a TE fails by


class HealthActed(Event, frozen=True, kw_only=True):
    host: str
    device: str  # an NPU, or the host for the node's level
    kind: str
    level: str
    action: str  # in words
    tes: tuple[str, ...] = ()  # the TEs declared failed


def on_alert(mgr: Any, ctx: Context, msg: HealthAlert) -> None:
    """`mgr`: the ClusterManager (its state, slots, config, `_failed` and `_do`)."""
    if msg.level == NODE or (msg.kind == "node" and msg.device == msg.host):
        action = _node(mgr, ctx, msg)
        tes: tuple[str, ...] = ()
    elif msg.level == INSTANCE:
        action, tes = _instance(mgr, msg)
    elif msg.level == RECOVERABLE:
        action, tes = "none: recoverable in place", ()
    else:
        return  # healthy again: nothing to act on
    ctx.record(HealthActed(host=msg.host, device=msg.device, kind=msg.kind, level=msg.level, action=action, tes=tes))
    why = f"device health: {msg.device} {msg.kind} ({msg.detail})" if msg.detail else f"device health: {msg.device} {msg.kind}"
    for te in tes:
        mgr._failed(ctx, te, mgr.state.tes[te].generation, why, DIAGNOSES[msg.kind])


def _instance(mgr: Any, msg: HealthAlert) -> tuple[str, tuple[str, ...]]:
    if msg.kind not in DIAGNOSES:
        return f"none: a {msg.kind} verdict names a KV path, not the faulty end (left to KV link routing)", ()
    st = mgr.state
    on = [te for te in sorted(st.tes) if te in mgr.slots and msg.device in L.slot_of(st, mgr.slots[te]).npus
          and st.tes[te].state not in ("stopped",)]  # fmt: skip
    serving = tuple(te for te in on if st.tes[te].state in ("ready", "draining"))
    if serving:
        return f"declared failed ({DIAGNOSES[msg.kind]}): the recovery ladder runs", serving
    if on:
        return f"none: {', '.join(on)} is not serving ({', '.join(st.tes[te].state for te in on)})", ()
    return "none: no TE runs on it", ()


def _node(mgr: Any, ctx: Context, msg: HealthAlert) -> str:
    server = int(msg.host.rpartition("/s")[2])
    if msg.level != NODE:
        return "none: a tainted node is untainted by its repair (recovery.node_repair_s)"
    st, cfg = mgr.state, mgr.cfg.recovery
    if not isinstance(st, L.LadderState):
        return "none: the replace rung has no taint (set recovery.rung)"
    if L._tainted(st, server):
        return f"none: s{server} is tainted already"
    mgr._do(ctx, L.Note(L.NodeTainted(server=server, reason=f"node down (device health): {msg.detail}")))
    if cfg.node_repair_s > 0:
        mgr._do(ctx, L.Repair(server, cfg.node_repair_s))
    return f"tainted s{server}: replacements go elsewhere"
