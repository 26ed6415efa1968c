"""The fabric actor: every link of a topology, the transfers crossing them, and link faults.

One actor per topology domain, so max-min sharing over multi-hop paths is computed in one place
(flows.py, with fairshare.py). One timer ("tick") is pending at a time: the next completion; it
is re-armed after every handler that changed something and after every tick, so a completion
can never be left without a timer. One exception saves a delivery: a transfer accepted into an
empty fabric (most DRAM-tier copies) has its completion in closed form, so its setup end is not
ticked; the tick is armed at the completion, and delivers it if nothing came before, while the
first other handler at or after the setup end records the start first, at that end, as its tick
would have (`FabricState.lone`). Link faults arrive as external inputs: down (in-flight and new
transfers fail), degraded (capacity x factor), flapping (down/up toggles on timers), up
(repaired).
"""

from __future__ import annotations

import functools

from deepserve.actors.ports.faults import LinkDegrade, LinkDown, LinkFlap, LinkUp
from deepserve.actors.ports.link import (
    LinkBroadcast,
    LinkBroadcastDone,
    LinkCancel,
    LinkProbe,
    LinkStatus,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.adapters.hardware.devices.common import ReplyTo, answer, reply_to, respond
from deepserve.adapters.hardware.devices.flows import (
    FabricFaultRejected,
    FabricFlapSet,
    FabricLinkSet,
    FabricLoneAccepted,
    FabricState,
    FabricXferAccepted,
    FabricXferDelivered,
    FabricXferFailed,
    FabricXfersFlowing,
    Flap,
    LinkCond,
    Xfer,
    capacity,
    done_slack_s,
    evolve_fabric,
    lone_delay_s,
    setup_end_s,
)
from deepserve.adapters.hardware.devices.topology import build, resource_link, route
from deepserve.adapters.hardware.specs import LINKS, link_spec
from deepserve.adapters.hardware.transfer import (
    broadcast_time_s,
    effective_bw_bytes_per_s,
    transfer_time_s,
)
from deepserve.core import Actor, Context, Event, Message

ROUTE_CACHE_LIMIT = 1 << 16  # memoised routes (a CloudMatrix384 has 768 x 767 die pairs)


class FabricSetupDone(Message, frozen=True):
    """No longer sent (setups end on the tick); kept so older logs still decode."""

    key: str


class FabricTick(Message, frozen=True):
    pass


class FabricFlapToggle(Message, frozen=True):
    link: str


@functools.lru_cache(maxsize=1024)
def fixed_cost_s(link_kind: str, messages: int) -> float:
    """Setup latency + per-message control cost of one transfer (transfer.py); the host side
    and the SSD have no link spec and cost only their bandwidth."""
    if link_kind not in LINKS:
        return 0.0
    return transfer_time_s(0, link_spec(link_kind), messages=messages)


def broadcast_fixed_s(link_kind: str, nbytes: int, targets: int) -> float:
    """A pipelined chain broadcast's cost beyond streaming the bytes once (transfer.py)."""
    spec = link_spec(link_kind)
    return broadcast_time_s(nbytes, spec, targets) - nbytes / effective_bw_bytes_per_s(spec)


def _bad_fault(msg: Message, known_link: bool) -> str | None:
    """Why a link fault input cannot apply, or None. Rejected faults are recorded, not raised:
    a typo in a fault plan must not restart the fabric."""
    if not known_link:
        return f"unknown link {msg.link!r}"  # type: ignore[attr-defined]
    if isinstance(msg, LinkDegrade) and not 0 < msg.bw_factor <= 1:
        return f"bw_factor must be in (0, 1], got {msg.bw_factor}"
    if isinstance(msg, LinkFlap) and not (msg.down_s > 0 and msg.up_s > 0 and msg.count >= 1):
        return f"need down_s > 0, up_s > 0, count >= 1; got {msg}"
    return None


class Fabric(Actor[FabricState]):
    """Owns the links of `build(cluster, servers)`; answers transfers, broadcasts and probes."""

    # The state changes only in `evolve_fabric` (handlers read it, record events), so a
    # snapshot copies it instead of folding every event a second time; the fold equals the
    # live state in tests/adapters/test_dev_fabric_scale.py.
    snapshot_from_live = True

    def __init__(self, cluster: str = "gen1", servers: int = 1) -> None:
        self.topo = build(cluster, servers)
        self.links = {link.name: link for link in self.topo.links}
        self.nominal = {
            f"{link.name}:{d}": link.capacity_bytes_per_s
            for link in self.topo.links
            for d in link.directions
        }
        self._routes: dict[tuple[str, str, str | None], tuple[tuple[str, ...], str]] = {}
        self.directions = {
            link.name: tuple(f"{link.name}:{d}" for d in link.directions) for link in self.topo.links
        }

    def initial_state(self) -> FabricState:
        return FabricState()

    def evolve(self, state: FabricState, event: Event) -> FabricState:
        return evolve_fabric(state, event, self.nominal, self.directions)

    def handle(self, ctx: Context, msg: Message) -> None:
        lone = self.state.lone
        if lone is not None:
            if isinstance(msg, FabricTick):  # its completion (the one tick while it is lone):
                self._deliver(ctx, self.state.xfers[lone])  # its start shared nothing, is not
                return  # recorded; the fabric is empty, nothing to arm
            lone = self._lone_start(ctx, lone)
        if isinstance(msg, FabricTick):
            self._tick(ctx)
            self._reschedule(ctx)  # always: a tick that delivered nothing must not end the clock
            return
        # The armed tick is the state's next completion (both roll back together if a handler
        # fails), so a handler that leaves the next completion alone leaves the timer alone.
        armed = self.state.next_event_s()
        if isinstance(msg, LinkTransfer | LinkBroadcast):
            if self._accept(ctx, msg):
                return  # its tick is armed at its completion
        elif isinstance(msg, LinkCancel):
            x = self.state.xfers.get(f"{ctx.sender}|{msg.req_id}")
            if x is not None:
                self._fail(ctx, x, "cancelled by the requester", None)
        elif isinstance(msg, LinkProbe):
            self._probe(ctx, msg)
        elif isinstance(msg, LinkDown | LinkUp | LinkDegrade | LinkFlap | FabricFlapToggle):
            self._fault(ctx, msg)
        else:
            return
        at = self.state.next_event_s()
        if lone is not None and self.state.lone is None and at == armed and at is not None:
            # a lone setup end, untimed until this handler changed the fabric: its tick fires
            # where the acceptance would have armed it (exact: flows.lone_delay_s)
            ctx.after(at - ctx.now(), FabricTick(), key="tick")
        elif ctx.events and at != armed:
            self._reschedule(ctx)

    def _lone_start(self, ctx: Context, key: str) -> str | None:
        """Record the untimed start of the lone transfer `key` if its setup has ended (at that
        end, as its tick would have: that tick came before anything at or after it). Returns
        the key while it is still in setup."""
        end = setup_end_s(self.state.xfers[key])
        if end > ctx.now():
            return key
        ctx.record(FabricXfersFlowing((key,), end))
        return None

    # ---- transfers ---------------------------------------------------------
    def _accept(self, ctx: Context, msg: LinkTransfer | LinkBroadcast) -> bool:
        """Accept or refuse a transfer; True if it armed the tick itself (a lone one)."""
        to = reply_to(ctx)
        key = f"{ctx.sender}|{msg.req_id}"
        try:
            xfer = self._xfer(ctx, msg, key, to)
        except ValueError as exc:
            answer(ctx, to, LinkTransferFailed(req_id=msg.req_id, reason=str(exc)))
            return False
        conds = self.state.conds
        down = None
        if conds:  # all links at nominal condition: nothing can be down
            down = next((r for r in xfer.resources if capacity(self.nominal, conds, r) <= 0), None)
        if down is not None:
            link = resource_link(down)
            reason = f"link {link} is down"
            answer(ctx, to, LinkTransferFailed(req_id=msg.req_id, reason=reason, link=link))
            return False
        st = self.state
        delay = None if st.xfers else lone_delay_s(st, self.nominal, ctx.now(), xfer)
        if delay is None:
            ctx.record(FabricXferAccepted(xfer))  # its setup ends on a tick (flows.starts)
            return False
        ctx.record(FabricLoneAccepted(xfer))
        ctx.after(delay, FabricTick(), key="tick")
        return True

    def _xfer(self, ctx: Context, msg: LinkTransfer | LinkBroadcast, key: str, to: ReplyTo) -> Xfer:
        if key in self.state.xfers:
            raise ValueError(f"req_id: {msg.req_id!r} is already in flight from {ctx.sender}")
        if msg.nbytes < 0:
            raise ValueError(f"nbytes: must be >= 0, got {msg.nbytes}")
        if isinstance(msg, LinkBroadcast):
            resources, kind = self._chain(msg)
            targets, fixed = msg.targets, broadcast_fixed_s(kind, msg.nbytes, len(msg.targets))
        else:
            if msg.messages < 1:
                raise ValueError(f"messages: must be >= 1, got {msg.messages}")
            resources, kind = self._path(msg)
            targets, fixed = (msg.dst,), fixed_cost_s(kind, msg.messages)
        return Xfer(
            key=key, req_id=msg.req_id, to=to, src=msg.src, targets=targets,
            broadcast=isinstance(msg, LinkBroadcast), resources=resources, link_kind=kind,
            nbytes=msg.nbytes, fingerprint=msg.fingerprint, accepted_at_s=ctx.now(), fixed_s=fixed,
        )  # fmt: skip

    def _path(self, msg: LinkTransfer) -> tuple[tuple[str, ...], str]:
        if not msg.path:
            return self._route(msg.src, msg.dst, msg.via)
        for r in msg.path:
            if r not in self.nominal:
                raise ValueError(f"path: unknown link direction {r!r} (expected 'link:dir')")
        if len(set(msg.path)) != len(msg.path):
            raise ValueError(f"path: crosses a link direction twice: {list(msg.path)}")
        return msg.path, self.links[resource_link(msg.path[0])].kind

    def _route(self, src: str, dst: str, via: str | None) -> tuple[tuple[str, ...], str]:
        """`topology.route`, memoised: a pure function of the endpoints, parsed per transfer."""
        key = (src, dst, via)
        hit = self._routes.get(key)
        if hit is None:
            r = route(self.topo, src, dst, via)
            if len(self._routes) >= ROUTE_CACHE_LIMIT:
                self._routes.clear()
            hit = self._routes[key] = (r.resources, r.link_kind)
        return hit

    def _chain(self, msg: LinkBroadcast) -> tuple[tuple[str, ...], str]:
        """Each target forwards to the next: the chain's hops all carry the stream at once."""
        if not msg.targets:
            raise ValueError("targets: a broadcast needs at least one target")
        hops = [
            route(self.topo, a, b, msg.via)
            for a, b in zip((msg.src, *msg.targets), msg.targets, strict=False)
        ]
        resources = tuple(r for hop in hops for r in hop.resources)
        if len(set(resources)) != len(resources):
            raise ValueError(f"targets: the chain {msg.src} -> {list(msg.targets)} reuses a link")
        kind = hops[0].link_kind
        if kind not in LINKS:
            raise ValueError(f"src: a broadcast runs between NPUs, not over {kind!r}")
        return resources, kind

    def _tick(self, ctx: Context) -> None:
        """Deliver every transfer due now, then start every transfer whose setup ends now,
        together (one repair of the allocation for a burst). Each delivery re-rates the flows
        it shared links with (they may become due too), so take the heap's top each time."""
        st = self.state
        horizon = ctx.now() + done_slack_s(ctx.now())
        self._deliver_due(ctx, horizon)
        keys = self._starting(horizon)
        if keys:
            ctx.record(FabricXfersFlowing(keys, ctx.now()))
            for key in keys:
                if st.xfers[key].nbytes == 0:
                    self._deliver(ctx, st.xfers[key])
            self._deliver_due(ctx, horizon)  # a few bytes late in a long run: due already

    def _deliver_due(self, ctx: Context, horizon: float) -> None:
        st = self.state
        while (top := st.next_due()) is not None and top[0] <= horizon:
            self._deliver(ctx, st.xfers[top[1]])

    def _starting(self, horizon: float) -> tuple[str, ...]:
        """Transfers whose setup ends by `horizon`: the heap's entries up to it, found by
        walking down from the root (no pops: the handler does not change the state)."""
        heap, xfers, found = self.state.starts, self.state.xfers, []
        if not heap or heap[0][0] > horizon:
            return ()
        stack = [0]
        while stack:
            i = stack.pop()
            if i < len(heap) and heap[i][0] <= horizon:
                t, key = heap[i]
                x = xfers.get(key)
                if x is not None and not x.flowing and setup_end_s(x) == t:
                    found.append(heap[i])
                stack += (2 * i + 1, 2 * i + 2)
        return tuple(dict.fromkeys(key for _, key in sorted(found)))

    def _deliver(self, ctx: Context, x: Xfer) -> None:
        now = ctx.now()
        ctx.record(FabricXferDelivered(x.key, now))
        duration = now - x.accepted_at_s
        if x.broadcast:
            done: Message = LinkBroadcastDone(
                req_id=x.req_id, src=x.src, targets=x.targets, nbytes=x.nbytes,
                duration_s=duration, link_kind=x.link_kind, fingerprint=x.fingerprint,
            )  # fmt: skip
        else:
            done = LinkTransferDone(
                req_id=x.req_id, src=x.src, dst=x.targets[0], nbytes=x.nbytes,
                duration_s=duration, link_kind=x.link_kind, fingerprint=x.fingerprint,
            )  # fmt: skip
        answer(ctx, x.to, done)

    def _fail(self, ctx: Context, x: Xfer, reason: str, link: str | None) -> None:
        ctx.record(FabricXferFailed(x.key, ctx.now(), reason))
        answer(ctx, x.to, LinkTransferFailed(req_id=x.req_id, reason=reason, link=link))

    def _reschedule(self, ctx: Context) -> None:
        at = self.state.next_event_s()
        if at is None:
            ctx.cancel("tick")
        else:
            ctx.after(max(0.0, at - ctx.now()), FabricTick(), key="tick")

    # ---- links -------------------------------------------------------------
    def _probe(self, ctx: Context, msg: LinkProbe) -> None:
        desc = self.links.get(msg.link)
        if desc is None:
            respond(
                ctx,
                LinkTransferFailed(req_id=msg.req_id, reason=f"link: unknown link {msg.link!r}"),
            )
            return
        cond = self.state.conds.get(msg.link, LinkCond())
        active = len(self._crossing(msg.link))
        status = LinkStatus(
            req_id=msg.req_id, link=msg.link, kind=desc.kind, up=cond.up,
            bw_factor=cond.bw_factor, active_transfers=active,
            capacity_bytes_per_s=desc.capacity_bytes_per_s * cond.bw_factor if cond.up else 0.0,
        )  # fmt: skip
        respond(ctx, status)

    def _fault(self, ctx: Context, msg: Message) -> None:
        link: str = msg.link  # type: ignore[attr-defined]
        bad = _bad_fault(msg, link in self.links)
        if bad is not None:
            ctx.record(FabricFaultRejected(f"{type(msg).__name__}: {bad}"))
            return
        cond = self.state.conds.get(link, LinkCond())
        if isinstance(msg, FabricFlapToggle):
            self._toggle(ctx, link, cond)
            return
        if link in self.state.flaps:  # an explicit fault ends flapping
            ctx.record(FabricFlapSet(link, None))
            ctx.cancel(f"flap:{link}")
        if isinstance(msg, LinkDown):
            self._set_link(ctx, link, False, cond.bw_factor)
        elif isinstance(msg, LinkUp):
            self._set_link(ctx, link, True, 1.0)
        elif isinstance(msg, LinkDegrade):
            self._set_link(ctx, link, cond.up, msg.bw_factor)
        elif isinstance(msg, LinkFlap):
            ctx.record(FabricFlapSet(link, Flap(msg.down_s, msg.up_s, msg.count - 1)))
            self._set_link(ctx, link, False, cond.bw_factor)
            ctx.after(msg.down_s, FabricFlapToggle(link), key=f"flap:{link}")

    def _toggle(self, ctx: Context, link: str, cond: LinkCond) -> None:
        flap = self.state.flaps.get(link)
        if flap is None:
            return
        if not cond.up:  # end of a down period
            self._set_link(ctx, link, True, cond.bw_factor)
            if flap.downs_left == 0:
                ctx.record(FabricFlapSet(link, None))
            else:
                ctx.after(flap.up_s, FabricFlapToggle(link), key=f"flap:{link}")
            return
        ctx.record(FabricFlapSet(link, Flap(flap.down_s, flap.up_s, flap.downs_left - 1)))
        self._set_link(ctx, link, False, cond.bw_factor)
        ctx.after(flap.down_s, FabricFlapToggle(link), key=f"flap:{link}")

    def _set_link(self, ctx: Context, link: str, up: bool, bw_factor: float) -> None:
        ctx.record(FabricLinkSet(link, up, bw_factor, ctx.now()))
        if up:
            return
        for key in self._crossing(link):
            self._fail(ctx, self.state.xfers[key], f"link {link} went down", link)

    def _crossing(self, link: str) -> list[str]:
        """Transfers (in setup or flowing) that cross either direction of `link`."""
        keys: dict[str, None] = {}
        for r in self.directions[link]:
            keys.update(self.state.on.get(r, {}))
        return list(keys)
