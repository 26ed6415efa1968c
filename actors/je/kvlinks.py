"""The JE acts on DistFlow link probing's verdicts (xDeepServe §6.1; P/D-Serve §3.4: "the meta
information ... is sent to all instances in this group to avoid actual transmission and
forwarding"). A decode channel's prober diagnoses a failed KV transfer's path (distflow/probe.py);
the host's device-health monitor records it and hands it to the cluster manager, which names the
TEs at both ends and tells every JE (`KvLinkVerdict`):

- `link-fault`: the path carries nothing. The JE stops pairing over it — the prefill→decode pair,
  or every pair of a TE whose RoCE NIC the fabric named — until it is seen healthy again (the
  monitor re-probes a blocked path until a dummy gets through: verdict `healthy`). This replaces
  the blind cool-down (`kv_fail_cooldown_s`), which set the *prefill* aside for a fixed time and
  then sent the next request down the same dead path.
- `saturation`: not a fault — the dummy arrived, late: the decode is busy. It gets no new decode
  task for `kv_saturated_s` while another decode can take one (backed off by load); no link is
  marked down.
- `transient`: the link is back already: no routing change.
- `reset`: the TE is a new instance (its replacement registered): what was known of its paths
  is forgotten.

Each change of the JE's view is a recorded `KvRouteChanged`; routing (routing.py) reads the view.
"""

from __future__ import annotations

from typing import Any

from deepserve.core import Event, Message

from .messages import JeState

LINK_FAULT = "link-fault"  # distflow/probe.py's verdicts
SATURATION = "saturation"
TRANSIENT = "transient"
HEALTHY = "healthy"  # the device-health monitor's re-probe got through
RESET = "reset"  # the cluster manager: `te` is a new instance
UNBUSY = "unbusy"  # the JE's timer: a saturated decode's back-off is over


class KvLinkVerdict(Message, frozen=True, kw_only=True):
    """Cluster manager → every JE: the verdict on the KV path from prefill TE `src_te` to decode TE
    `dst_te` (`nic_te`: the TE whose RoCE NIC the failing link is, "" when none was named; for
    `reset`, the new instance; for `unbusy`, the JE's own timer, `dst_te` the decode)."""

    verdict: str
    src_te: str = ""
    dst_te: str = ""
    nic_te: str = ""
    link: str = ""
    detected_s: float = 0.0


class KvRouteChanged(Event, frozen=True, kw_only=True):
    """The JE's view of the KV paths changed: `key` ("P>D" a pair, "nic:T" a TE's NIC, "busy:D" a
    saturated decode) marked (`down`, until `until_s` for a busy decode; 0: until told) or cleared."""

    key: str
    down: bool
    until_s: float = 0.0
    reason: str = ""


def pair(src_te: str, dst_te: str) -> str:
    return f"{src_te}>{dst_te}"


def path_down(s: JeState, src_te: str, dst_te: str) -> str:
    """Why the KV path from prefill `src_te` to decode `dst_te` is not to be used ("": usable)."""
    d = s.kv_down
    if not d:
        return ""
    return d.get(pair(src_te, dst_te)) or d.get(f"nic:{src_te}") or d.get(f"nic:{dst_te}") or ""


def busy_until(s: JeState, dst_te: str) -> float:
    return s.kv_busy.get(dst_te, -1.0)


def on_verdict(s: JeState, now: float, fx: Any, m: KvLinkVerdict, saturated_s: float) -> None:
    """One verdict, as the routing changes it makes (recorded)."""
    d = s.kv_down
    why = f"{m.verdict} at t={m.detected_s:.3f}" + (f" over {m.link}" if m.link else "")
    if m.verdict == LINK_FAULT:
        key = f"nic:{m.nic_te}" if m.nic_te else pair(m.src_te, m.dst_te)
        if key not in d:
            fx.record(KvRouteChanged(key=key, down=True, reason=f"KV path {m.src_te}->{m.dst_te}: {why}"))
    elif m.verdict == SATURATION and saturated_s > 0 and m.dst_te:
        fx.record(KvRouteChanged(key=f"busy:{m.dst_te}", down=True, until_s=now + saturated_s,
                                 reason=f"decode saturated (KV path from {m.src_te}: {why})"))  # fmt: skip
        # the JE's own timer ends the back-off (routing reads no clock for it)
        fx.after(saturated_s, KvLinkVerdict(verdict=UNBUSY, dst_te=m.dst_te), key=f"kvbusy/{m.dst_te}")
    elif m.verdict == UNBUSY and m.dst_te in s.kv_busy and s.kv_busy[m.dst_te] <= now:
        fx.record(KvRouteChanged(key=f"busy:{m.dst_te}", down=False, reason="the back-off ended"))
    elif m.verdict == HEALTHY:
        # the dummy crossed the pair's path: the pair and both ends' NICs carry data again
        for key in (pair(m.src_te, m.dst_te), f"nic:{m.src_te}", f"nic:{m.dst_te}"):
            if key in d:
                fx.record(KvRouteChanged(key=key, down=False, reason=f"KV path {m.src_te}->{m.dst_te}: {why}"))
    elif m.verdict == RESET and m.nic_te:
        te = m.nic_te
        for key in sorted(k for k in d if k == f"nic:{te}" or k.startswith(f"{te}>") or k.endswith(f">{te}")):
            fx.record(KvRouteChanged(key=key, down=False, reason=f"{te} is a new instance"))
        if te in s.kv_busy:
            fx.record(KvRouteChanged(key=f"busy:{te}", down=False, reason=f"{te} is a new instance"))
    # TRANSIENT: the link is back by the time it was probed — no routing change


def fold_route(s: JeState, e: KvRouteChanged, _: int = 0) -> None:
    if e.key.startswith("busy:"):
        te = e.key[5:]
        if e.down:
            s.kv_busy[te] = e.until_s
        else:
            s.kv_busy.pop(te, None)
    elif e.down:
        s.kv_down[e.key] = e.reason
    else:
        s.kv_down.pop(e.key, None)


EVENTS: tuple[type[Event], ...] = (KvRouteChanged,)
