"""DistFlow link probing (xDeepServe §6.1): the KV-transfer path runs beside the DP masters' loops,
so heartbeats cannot see it stall. A decode master's channel (channel.py) watches its transfers'
outcomes; when one fails or times out it asks its prober (this actor, `{channel}/probe`, spawned
only when `kv_link_probe_s` > 0) to send a dummy payload down the same path:

- the dummy arrives although the transfer had timed out: the link carries data — the decode side
  (or the link's sharing) was saturated; a verdict of `SATURATION` with the dummy's delay;
- the dummy arrives after the transfer failed on the link: the link is back (a flap) — `TRANSIENT`;
- the dummy fails too, or does not arrive within `probe_s`: everything on the path is blocked —
  `LINK_FAULT`, naming the link when the fabric did.

Each probe and verdict is a recorded event (`LinkProbeSent`, `LinkDiagnosed`: the failure's time
and the detection time, so the time to diagnose is in the log); a verdict also goes to
`report_to` (the host's device-health monitor, actors/cluster/health.py) when set. One probe per
path at a time: the failures of a burst on a dead link are one diagnosis.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.link import (
    LinkCancel,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.core import Actor, Context, Event, Message

SATURATION = "saturation"  # the dummy was delivered after a timeout: the path works, it is loaded
TRANSIENT = "transient"  # the dummy was delivered after a link failure: the link is back
LINK_FAULT = "link-fault"  # the dummy failed or never arrived: the path is blocked
TIMEOUT = "timeout"  # ProbeLink.cause: the transfer timed out (else: it failed on the link)
PROBE = "probe:"  # LinkTransfer ids of dummies


class ProberConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    fabric: str = "hw/fabric"
    probe_s: float = 2.0  # a dummy not delivered within this long: the path is blocked
    probe_bytes: int = 4096
    report_to: str = ""  # the device-health monitor told of each verdict ("": nobody)

    def __post_init__(self) -> None:
        if not self.probe_s > 0 or self.probe_bytes < 1:
            raise ValueError("ProberConfig: probe_s > 0 and probe_bytes >= 1")


class ProbeLink(Message, frozen=True, kw_only=True):
    """Channel → its prober: a transfer from `src` to `dst` failed (`cause`: TIMEOUT, or the
    link failure's reason) at `failed_s`."""

    task_id: str
    src: str
    dst: str
    cause: str
    failed_s: float


class ProbeTimeout(Message, frozen=True, kw_only=True):
    probe_id: str


class KvLinkDiagnosis(Message, frozen=True, kw_only=True):
    """Prober → `report_to`: the verdict on a KV path (see `LinkDiagnosed`)."""

    src: str
    dst: str
    verdict: str
    link: str
    failed_s: float
    detected_s: float


class LinkProbeSent(Event, frozen=True, kw_only=True):
    probe_id: str
    task_id: str
    src: str
    dst: str
    cause: str
    failed_s: float
    sent_s: float


class LinkDiagnosed(Event, frozen=True, kw_only=True):
    """The verdict on the path of a failed transfer: SATURATION, TRANSIENT or LINK_FAULT;
    detected `detected_s - failed_s` after the transfer failed (`delay_s`: the dummy's trip)."""

    probe_id: str
    src: str
    dst: str
    verdict: str
    link: str  # the link that failed the dummy, when the fabric named it
    failed_s: float
    detected_s: float
    delay_s: float = 0.0
    reason: str = ""


class ProberState(msgspec.Struct, kw_only=True):
    probes: dict[str, LinkProbeSent] = {}  # in flight, by probe id
    sent: int = 0
    verdicts: dict[str, int] = {}


class LinkProber(Actor[ProberState]):
    def __init__(self, config: object = None) -> None:
        self.cfg = config if isinstance(config, ProberConfig) else msgspec.convert(config or {}, ProberConfig)

    def initial_state(self) -> ProberState:
        return ProberState()

    def evolve(self, s: ProberState, e: Event) -> ProberState:
        if isinstance(e, LinkProbeSent):
            s.probes[e.probe_id] = e
            s.sent += 1
        elif isinstance(e, LinkDiagnosed):
            s.probes.pop(e.probe_id, None)
            s.verdicts[e.verdict] = s.verdicts.get(e.verdict, 0) + 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        st, cfg = self.state, self.cfg
        if isinstance(msg, ProbeLink):
            if any(p.src == msg.src and p.dst == msg.dst for p in st.probes.values()):
                return  # this path is being probed: one diagnosis for the burst
            pid = f"{PROBE}{st.sent}"
            ctx.record(LinkProbeSent(probe_id=pid, task_id=msg.task_id, src=msg.src, dst=msg.dst, cause=msg.cause,
                                     failed_s=msg.failed_s, sent_s=ctx.now()))  # fmt: skip
            ctx.send(cfg.fabric, LinkTransfer(req_id=pid, src=msg.src, dst=msg.dst, nbytes=cfg.probe_bytes))
            ctx.after(cfg.probe_s, ProbeTimeout(probe_id=pid), key=pid)
        elif isinstance(msg, LinkTransferDone) and msg.req_id in st.probes:
            p = st.probes[msg.req_id]
            ctx.cancel(msg.req_id)
            verdict = SATURATION if p.cause == TIMEOUT else TRANSIENT
            self._verdict(ctx, p, verdict, "", ctx.now() - p.sent_s, "the dummy payload was delivered")
        elif isinstance(msg, LinkTransferFailed) and msg.req_id in st.probes:
            ctx.cancel(msg.req_id)
            self._verdict(ctx, st.probes[msg.req_id], LINK_FAULT, msg.link or "", 0.0,
                          f"the dummy payload failed too: {msg.reason}")  # fmt: skip
        elif isinstance(msg, ProbeTimeout) and msg.probe_id in st.probes:
            ctx.send(cfg.fabric, LinkCancel(req_id=msg.probe_id))
            self._verdict(ctx, st.probes[msg.probe_id], LINK_FAULT, "", cfg.probe_s,
                          f"the dummy payload was not delivered within {cfg.probe_s:g}s")  # fmt: skip

    def _verdict(self, ctx: Context, p: LinkProbeSent, verdict: str, link: str, delay_s: float, why: str) -> None:
        now = ctx.now()
        ctx.record(LinkDiagnosed(probe_id=p.probe_id, src=p.src, dst=p.dst, verdict=verdict, link=link,
                                 failed_s=p.failed_s, detected_s=now, delay_s=delay_s, reason=why))  # fmt: skip
        if self.cfg.report_to:
            ctx.send(self.cfg.report_to, KvLinkDiagnosis(src=p.src, dst=p.dst, verdict=verdict, link=link,
                                                         failed_s=p.failed_s, detected_s=now))  # fmt: skip
