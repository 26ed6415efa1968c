"""The fabric's state and its evolution: transfers in flight and the condition of links.

A transfer first pays its fixed cost (setup latency + per-message control, from transfer.py),
then flows: its bytes cross every link direction of its path at the max-min fair rate, kept by
`fairshare.MaxMinShare`, which repairs the allocation locally when a flow starts or ends or a
link changes. Bytes are lazy: each flowing transfer keeps `bytes_left` at `since_s` and its
rate, so an event re-anchors only the transfers whose rate it changed, and their projected
finish times go on a heap (`due`). Per-event work follows what changed, not how many flows are
in flight.

The state is owned by the fabric actor and updated in place by `evolve_fabric` (copying every
in-flight record per event is what made the fabric cubic); it is still exactly the fold of the
recorded events, deterministic (insertion-ordered dicts, no sets), and msgpack-encodable.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping

import msgspec

from deepserve.adapters.hardware.devices.common import RTOL, ReplyTo, delay_until
from deepserve.adapters.hardware.devices.topology import resource_link
from deepserve.adapters.hardware.fairshare import MaxMinShare
from deepserve.core import Event

# A flow whose projected finish is this close to the clock is complete: the tick fires at
# now + (finish - now), which rounds to within an ulp of the finish, and re-anchoring at large
# times loses a few ulps more. The slack is relative to the clock (a fixed 1 ns said "not yet"
# forever to 1 GB injected at t = 1e8 s, where one ulp is 15 ns).
DONE_ULPS = 8
DONE_EPS_S = 1e-15  # floor near t = 0


def done_slack_s(now_s: float) -> float:
    return max(DONE_EPS_S, DONE_ULPS * math.ulp(now_s))


class Xfer(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # unique in the fabric: requester + req_id
    req_id: str
    to: ReplyTo
    src: str
    targets: tuple[str, ...]  # one for a transfer, several for a broadcast
    broadcast: bool
    resources: tuple[str, ...]
    link_kind: str
    nbytes: int
    fingerprint: str | None
    accepted_at_s: float
    fixed_s: float
    flowing: bool = False  # its setup has ended (its progress, if any bytes: FabricState.flow)


class LinkCond(msgspec.Struct, frozen=True):
    up: bool = True
    bw_factor: float = 1.0


class Flap(msgspec.Struct, frozen=True):
    down_s: float
    up_s: float
    downs_left: int  # down periods still to come after the current one


class FabricState(msgspec.Struct):
    xfers: dict[str, Xfer] = {}
    on: dict[str, dict[str, None]] = {}  # link direction -> transfers crossing it (any phase)
    share: MaxMinShare = msgspec.field(default_factory=MaxMinShare)
    # progress of each flowing transfer with bytes, mutated in place by a repair (a Struct copy
    # per re-rated flow was the cost): [bytes left at since_s, since_s, rate in bytes per
    # second, projected finish_s (inf while not progressing)]
    flow: dict[str, list[float]] = {}
    due: list[tuple[float, str]] = []  # heap of (finish_s, key); the top is always current
    starts: list[tuple[float, str]] = []  # heap of (end of setup, key) of transfers in setup
    conds: dict[str, LinkCond] = {}  # links not at nominal condition
    flaps: dict[str, Flap] = {}
    delivered: int = 0
    delivered_bytes: int = 0
    failed: int = 0
    # A transfer accepted into an empty fabric whose setup end has no tick (fabric.py,
    # `lone_delay_s`): delivered by the tick at its completion (its start, sharing nothing, is
    # not recorded) unless another handler comes first: that one records its start, at its
    # setup end if that has passed. Any other change to transfers or links ends this (the setup
    # end is ticked again).
    lone: str | None = None

    def __deepcopy__(self, memo: dict) -> FabricState:
        """The kernel deep-copies states for snapshots: the records inside are immutable, so
        copying the containers is a deep copy (and far cheaper than copy's generic walk)."""
        return FabricState(
            xfers=dict(self.xfers), on={r: dict(keys) for r, keys in self.on.items()},
            share=self.share.__deepcopy__(memo), flow={k: list(v) for k, v in self.flow.items()},
            due=list(self.due), starts=list(self.starts),
            conds=dict(self.conds),
            flaps=dict(self.flaps), delivered=self.delivered,
            delivered_bytes=self.delivered_bytes, failed=self.failed, lone=self.lone,
        )  # fmt: skip

    def next_due(self) -> tuple[float, str] | None:
        """(finish time, key) of the transfer that completes first, if any progresses."""
        return self.due[0] if self.due else None

    def next_start(self) -> tuple[float, str] | None:
        """(time, key) of the transfer whose setup ends first."""
        return self.starts[0] if self.starts else None

    def next_event_s(self) -> float | None:
        """When the fabric next has something to do on its own: a setup ends or a flow ends."""
        due, starts = self.due, self.starts
        if not due:
            return starts[0][0] if starts else None
        return min(due[0][0], starts[0][0]) if starts else due[0][0]


# ---- events ----------------------------------------------------------------


class FabricXferAccepted(Event, frozen=True):
    xfer: Xfer


class FabricLoneAccepted(Event, frozen=True):
    """A transfer accepted into an empty fabric, its setup end untimed (FabricState.lone)."""

    xfer: Xfer


class FabricXferFlowing(Event, frozen=True):
    """One transfer starts sharing (older logs; the fabric now records FabricXfersFlowing)."""

    key: str
    at_s: float


class FabricXfersFlowing(Event, frozen=True):
    """Transfers whose setup ended at the same instant start sharing together (one repair)."""

    keys: tuple[str, ...]
    at_s: float


class FabricXferDelivered(Event, frozen=True):
    key: str
    at_s: float


class FabricXferFailed(Event, frozen=True):
    key: str
    at_s: float
    reason: str


class FabricLinkSet(Event, frozen=True):
    link: str
    up: bool
    bw_factor: float
    at_s: float


class FabricFlapSet(Event, frozen=True):
    link: str
    flap: Flap | None  # None: the link stops flapping


class FabricFaultRejected(Event, frozen=True):
    """A fault input that names no link of this fabric, or bad parameters: kept in the log."""

    reason: str


# ---- evolution ---------------------------------------------------------------


def capacity(nominal: Mapping[str, float], conds: Mapping[str, LinkCond], resource: str) -> float:
    cond = conds.get(resource_link(resource))
    if cond is None:
        return nominal[resource]
    return nominal[resource] * cond.bw_factor if cond.up else 0.0


def bytes_left_at(st: FabricState, key: str, at_s: float) -> float:
    """Bytes a flowing transfer still has to move at `at_s` (its total before it flows)."""
    fl = st.flow.get(key)
    if fl is None:
        x = st.xfers[key]
        return 0.0 if x.flowing else float(x.nbytes)
    return max(0.0, fl[0] - fl[2] * (at_s - fl[1]))


def _rerated(st: FabricState, changed: Mapping[str, float], at_s: float) -> None:
    """Re-anchor the transfers whose rate changed at `at_s` and queue their new finish
    (`bytes_left_at`, inlined: this runs for every flow a repair touches)."""
    flow, due, push = st.flow, st.due, heapq.heappush
    for key, rate in changed.items():
        fl = flow[key]
        left = fl[0] - fl[2] * (at_s - fl[1])
        if left < 0.0:
            left = 0.0
        fl[0], fl[1], fl[2] = left, at_s, rate
        if rate > 0:
            fl[3] = finish = at_s + left / rate
            push(due, (finish, key))
        else:
            fl[3] = math.inf


def setup_end_s(x: Xfer) -> float:
    return x.accepted_at_s + x.fixed_s


def lone_delay_s(st: FabricState, nominal: Mapping[str, float], now: float, x: Xfer) -> float | None:
    """The tick delay to the completion of `x`, accepted now into an empty fabric, if nothing
    else comes: where the tick its setup end arms fires, from its rate alone on its links (the
    water-filling gives a lone flow its narrowest link, to the bit). None where the stepwise
    ticks are needed: no bytes; done within the slack of its own start; a setup end or a
    completion that a timer armed now (or, for the setup end, by any handler until then) cannot
    hit exactly (`end - t` is exact for t >= end / 2: Sterbenz)."""
    end = setup_end_s(x)
    if x.nbytes <= 0 or not now < end <= 2.0 * now:
        return None
    rate = min(capacity(nominal, st.conds, r) for r in x.resources)
    if not rate > 0:
        return None
    finish = end + float(x.nbytes) / rate  # _rerated at the start
    if finish <= end + done_slack_s(end):
        return None
    done = end + (finish - end)  # the tick the setup end arms
    delay = delay_until(now, done)
    return delay if now + delay == done else None  # not when it rounds past `done`


def _tidy_starts(st: FabricState) -> None:
    starts, xfers = st.starts, st.xfers

    def live(entry: tuple[float, str]) -> bool:
        x = xfers.get(entry[1])
        return x is not None and not x.flowing and setup_end_s(x) == entry[0]

    while starts and not live(starts[0]):
        heapq.heappop(starts)


def _tidy_due(st: FabricState) -> None:
    """Drop superseded heap entries from the top (so `next_due` is current); rebuild the heap
    when stale entries are three times the live ones (amortised O(1) per push, bounded
    memory; a rebuild walks the whole heap, so not too often: ~6 pushes per transfer)."""
    due, flow = st.due, st.flow
    if len(due) > 4 * len(flow) + 64:
        due[:] = [e for e in due if (fl := flow.get(e[1])) is not None and fl[3] == e[0]]
        heapq.heapify(due)
    while due:
        finish, key = due[0]
        fl = flow.get(key)
        if fl is not None and fl[3] == finish:
            return
        heapq.heappop(due)


def _unlink(st: FabricState, x: Xfer) -> None:
    for r in x.resources:
        on = st.on[r]
        del on[x.key]
        if not on:
            del st.on[r]


def _end(st: FabricState, key: str, at_s: float) -> Xfer:
    x = st.xfers.pop(key)
    _unlink(st, x)
    if st.flow.pop(key, None) is not None:
        _rerated(st, st.share.remove(key), at_s)
    return x


def evolve_fabric(
    st: FabricState, event: Event, nominal: Mapping[str, float],
    directions: Mapping[str, tuple[str, ...]],
) -> FabricState:  # fmt: skip
    """Apply one event in place; `directions` maps a link to its "link:dir" resources."""
    if isinstance(event, FabricXferAccepted | FabricLoneAccepted):
        x = event.xfer
        st.xfers[x.key] = x
        for r in x.resources:
            st.on.setdefault(r, {})[x.key] = None
        heapq.heappush(st.starts, (setup_end_s(x), x.key))
        st.lone = x.key if isinstance(event, FabricLoneAccepted) else None
        return st
    lone, st.lone = st.lone, None  # any change but a flap's schedule or a rejected fault ends it
    if isinstance(event, FabricXfersFlowing | FabricXferFlowing):
        keys = event.keys if isinstance(event, FabricXfersFlowing) else (event.key,)
        at, sharing = event.at_s, []
        for key in keys:
            x = st.xfers[key]
            st.xfers[key] = msgspec.structs.replace(x, flowing=True)
            if x.nbytes > 0:  # a zero-byte transfer is delivered at once, sharing nothing
                st.flow[key] = [float(x.nbytes), at, 0.0, math.inf]
                sharing.append((key, x.resources))

        def cap(r: str) -> float:
            return capacity(nominal, st.conds, r)

        if sharing:
            _rerated(st, st.share.add_many(sharing, cap), at)
    elif isinstance(event, FabricXferDelivered):
        x = _end(st, event.key, event.at_s)
        st.delivered += 1
        st.delivered_bytes += x.nbytes * len(x.targets)
    elif isinstance(event, FabricXferFailed):
        _end(st, event.key, event.at_s)
        st.failed += 1
    elif isinstance(event, FabricLinkSet):
        if event.up and event.bw_factor == 1.0:
            st.conds.pop(event.link, None)
        else:
            st.conds[event.link] = LinkCond(event.up, event.bw_factor)
        for r in directions[event.link]:
            changed = st.share.set_capacity(r, capacity(nominal, st.conds, r))
            _rerated(st, changed, event.at_s)
    elif isinstance(event, FabricFlapSet):
        if event.flap is None:
            st.flaps.pop(event.link, None)
        else:
            st.flaps[event.link] = event.flap
        st.lone = lone  # a flap's capacity change is its own event (FabricLinkSet)
        return st
    elif isinstance(event, FabricFaultRejected):
        st.lone = lone
        return st
    else:
        raise AssertionError(f"fabric: unknown event {type(event).__name__}")
    _tidy_due(st)
    _tidy_starts(st)
    return st


def check_conservation(state: FabricState, nominal: Mapping[str, float]) -> None:
    """No link direction carries more than its capacity; every flow on live links progresses.
    O(flows): for tests and debugging (the fabric checks the links each change touches)."""
    load: dict[str, float] = {}
    for x in state.xfers.values():
        if not x.flowing or x.nbytes == 0:
            continue
        rate = state.flow[x.key][2]
        caps = [capacity(nominal, state.conds, r) for r in x.resources]
        if min(caps) > 0 and rate <= 0:
            raise AssertionError(f"transfer {x.key} is flowing at rate 0")
        for r in x.resources:
            load[r] = load.get(r, 0.0) + rate
    for r, total in load.items():
        cap = capacity(nominal, state.conds, r)
        if total > cap * (1 + RTOL):
            raise AssertionError(f"link {r} carries {total} B/s > capacity {cap} B/s")
