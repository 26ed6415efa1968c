"""KV path verdicts in the control plane (issue 33; xDeepServe §6.1 link probing, P/D-Serve §3.4:
the resident process per node records the faults, MLOps acts, "the meta information is sent to all
instances in this group to avoid actual transmission and forwarding").

A decode channel's prober (distflow/probe.py) reports each verdict to its host's device-health
monitor (health.py). With KV link routing on (`HealthConfig.reprobe_s` > 0):

- the monitor passes the verdict on to the cluster manager, and probes a blocked path again every
  `reprobe_s` (a dummy payload; nobody sends KV over it any more, so only a probe can see it come
  back) until one gets through: verdict `healthy`, passed on too (`KvPathWatched` records both);
- the manager names the TEs at both ends (and the TE whose RoCE NIC the fabric named), records the
  verdict (`KvPathVerdict`) and tells every JE (`KvLinkVerdict`, actors/je/kvlinks.py), which
  stops or resumes pairing over the path; the recovery ladder may act on a dead NIC (ladder.py's
  `reroute` rung). A TE's replacement, once registered, is a new instance: the JEs forget its
  paths (`reset`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.distflow.probe import LINK_FAULT, KvLinkDiagnosis
from deepserve.actors.je.kvlinks import HEALTHY, RESET, KvLinkVerdict
from deepserve.actors.ports.link import (
    LinkCancel,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.core import Context, Event, Message

REPROBE = "reprobe:"  # LinkTransfer ids of the monitor's dummies: reprobe:<n>:<src>><dst>


class Reprobe(Message, frozen=True, kw_only=True):
    """The monitor's timer: probe the blocked path `path` ("src>dst" NPUs) again."""

    path: str


class KvPathWatched(Event, frozen=True, kw_only=True):
    """The monitor's view of a KV path: `blocked` (re-probed until healthy) or not; `probe_id`: the
    dummy just sent down it ("" when none)."""

    path: str
    blocked: bool
    link: str = ""
    probe_id: str = ""
    at_s: float


class KvPathVerdict(Event, frozen=True, kw_only=True):
    """The manager: a verdict on the KV path between two TEs, told to every JE."""

    verdict: str
    src: str
    dst: str
    src_te: str
    dst_te: str
    nic_te: str
    link: str
    detected_s: float


# ---- the host's monitor --------------------------------------------------------------------------


def evolve(s: Any, e: KvPathWatched) -> None:
    if e.blocked:
        s.blocked[e.path] = e.probe_id or s.blocked.get(e.path, "")
        s.reprobes += bool(e.probe_id)
    else:
        s.blocked.pop(e.path, None)


def handles(msg: Message) -> bool:
    return type(msg) is Reprobe or (type(msg) in (LinkTransferDone, LinkTransferFailed)
                                    and msg.req_id.startswith(REPROBE))  # type: ignore[attr-defined]  # fmt: skip


def diagnosed(mon: Any, ctx: Context, msg: KvLinkDiagnosis) -> None:
    """A prober's verdict at the monitor: passed on; a blocked path watched until it carries data."""
    st, cfg = mon.state, mon.cfg
    if cfg.report_to:
        ctx.send(cfg.report_to, msg)
    path = f"{msg.src}>{msg.dst}"
    if msg.verdict == LINK_FAULT and path not in st.blocked:
        ctx.record(KvPathWatched(path=path, blocked=True, link=msg.link, at_s=ctx.now()))
        ctx.after(cfg.reprobe_s, Reprobe(path=path), key=f"reprobe/{path}")
    elif msg.verdict != LINK_FAULT and path in st.blocked:  # a dummy got through: it carries again
        ctx.cancel(f"reprobe/{path}")
        ctx.record(KvPathWatched(path=path, blocked=False, at_s=ctx.now()))


def handle(mon: Any, ctx: Context, msg: Message) -> None:
    st, cfg = mon.state, mon.cfg
    if isinstance(msg, Reprobe):
        if msg.path not in st.blocked:
            return
        if st.blocked[msg.path]:  # the last dummy never arrived: withdrawn, a new one goes
            ctx.send(cfg.fabric, LinkCancel(req_id=st.blocked[msg.path]))
        src, _, dst = msg.path.partition(">")
        pid = f"{REPROBE}{st.reprobes}:{msg.path}"
        ctx.record(KvPathWatched(path=msg.path, blocked=True, probe_id=pid, at_s=ctx.now()))
        ctx.send(cfg.fabric, LinkTransfer(req_id=pid, src=src, dst=dst, nbytes=cfg.probe_bytes))
        ctx.after(cfg.reprobe_s, Reprobe(path=msg.path), key=f"reprobe/{msg.path}")
    elif isinstance(msg, LinkTransferDone):
        path = msg.req_id.split(":", 2)[2]
        if st.blocked.get(path) != msg.req_id:
            return
        ctx.cancel(f"reprobe/{path}")
        ctx.record(KvPathWatched(path=path, blocked=False, at_s=ctx.now()))
        src, _, dst = path.partition(">")
        mon._set(ctx, dst, "healthy", "", f"KV path from {src} carries data again")
        if cfg.report_to:
            ctx.send(cfg.report_to, KvLinkDiagnosis(src=src, dst=dst, verdict=HEALTHY, link="",
                                                    failed_s=ctx.now(), detected_s=ctx.now()))  # fmt: skip
    # LinkTransferFailed: still blocked; the next Reprobe tries again


# ---- the cluster manager -------------------------------------------------------------------------


def nic_of(npu: str) -> str:
    """The RoCE NIC link of an NPU (hw/s1/npu0 -> s1/npu0/roce: the fabric's name for it)."""
    return f"{npu.removeprefix('hw/')}/roce"


def te_on(mgr: Any, npu: str) -> str:
    """The serving TE whose NPUs include `npu` ("" when none), where the ladder placed it."""
    from .ladder_state import slot_of

    st = mgr.state
    for te, slot in sorted(mgr.slots.items()):
        r = st.tes.get(te)
        if r is not None and r.state in ("ready", "draining") and npu in slot_of(st, slot).npus:
            return str(te)
    return ""


def verdict(mgr: Any, ctx: Context, msg: KvLinkDiagnosis) -> KvLinkVerdict:
    """A monitor's verdict at the manager: the TEs named, recorded, told to every JE."""
    src_te, dst_te = te_on(mgr, msg.src), te_on(mgr, msg.dst)
    nic_te = ""
    if msg.link and msg.link == nic_of(msg.src):
        nic_te = src_te
    elif msg.link and msg.link == nic_of(msg.dst):
        nic_te = dst_te
    ctx.record(KvPathVerdict(verdict=msg.verdict, src=msg.src, dst=msg.dst, src_te=src_te, dst_te=dst_te,
                             nic_te=nic_te, link=msg.link, detected_s=msg.detected_s))  # fmt: skip
    v = KvLinkVerdict(verdict=msg.verdict, src_te=src_te, dst_te=dst_te, nic_te=nic_te, link=msg.link,
                      detected_s=msg.detected_s)  # fmt: skip
    tell(mgr, ctx, v)
    return v


def tell(mgr: Any, ctx: Context, v: KvLinkVerdict) -> None:
    for je in mgr.cfg.jes:
        ctx.send(je, v)


def reset(mgr: Any, ctx: Context, te: str) -> None:
    """`te`'s replacement registered: a new instance, whose paths the JEs forget."""
    tell(mgr, ctx, msgspec.structs.replace(KvLinkVerdict(verdict=RESET), nic_te=te, detected_s=ctx.now()))
