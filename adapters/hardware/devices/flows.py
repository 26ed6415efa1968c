"""The fabric's state and its pure evolution: transfers in flight and the condition of links.

A transfer first pays its fixed cost (setup latency + per-message control, from transfer.py),
then flows: its bytes cross every link direction of its path at the max-min fair rate
(fairshare.py), recomputed whenever a flow starts or ends or a link changes. Every event carries
its time; `evolve` first advances the bytes of every flow to that time at the rates in force,
then applies the change, then recomputes the rates — so the state is a fold of the events.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from deepserve.adapters.hardware.devices.common import RTOL, ReplyTo
from deepserve.adapters.hardware.devices.topology import resource_link
from deepserve.adapters.hardware.fairshare import max_min_rates
from deepserve.core import Event

# A flow with less than this much transfer time left is complete: timers fire at float times,
# so the last bytes may be a rounding error away from zero.
DONE_EPS_S = 1e-9


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
    flowing: bool = False
    bytes_left: float = 0.0
    rate: float = 0.0  # bytes per second while flowing


class LinkCond(msgspec.Struct, frozen=True):
    up: bool = True
    bw_factor: float = 1.0


class Flap(msgspec.Struct, frozen=True):
    down_s: float
    up_s: float
    downs_left: int  # down periods still to come after the current one


class FabricState(msgspec.Struct, frozen=True):
    now_s: float = 0.0  # the time `bytes_left` values refer to
    xfers: dict[str, Xfer] = {}
    conds: dict[str, LinkCond] = {}  # links not at nominal condition
    flaps: dict[str, Flap] = {}
    delivered: int = 0
    delivered_bytes: int = 0
    failed: int = 0


# ---- events ----------------------------------------------------------------


class FabricXferAccepted(Event, frozen=True):
    xfer: Xfer


class FabricXferFlowing(Event, frozen=True):
    key: str
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


# ---- pure functions ----------------------------------------------------------


def capacity(nominal: Mapping[str, float], conds: Mapping[str, LinkCond], resource: str) -> float:
    cond = conds.get(resource_link(resource))
    if cond is None:
        return nominal[resource]
    return nominal[resource] * cond.bw_factor if cond.up else 0.0


def advance(state: FabricState, at_s: float) -> FabricState:
    """Move every flow's bytes forward to `at_s` at the current rates."""
    dt = at_s - state.now_s
    assert dt >= -RTOL * max(1.0, abs(at_s)), f"fabric time went back: {state.now_s} -> {at_s}"
    if dt <= 0:
        return state
    xfers = {}
    for k, x in state.xfers.items():
        if x.flowing and x.rate > 0:
            x = msgspec.structs.replace(x, bytes_left=max(0.0, x.bytes_left - x.rate * dt))
        xfers[k] = x
    return msgspec.structs.replace(state, now_s=at_s, xfers=xfers)


def rerate(state: FabricState, nominal: Mapping[str, float]) -> FabricState:
    """Max-min fair rates for the flowing transfers under the current link capacities.

    A transfer crossing a down link gets rate 0 here; the handler that took the link down
    fails it before anything else happens."""
    caps: dict[str, float] = {}
    flows: dict[str, tuple[str, ...]] = {}
    for k, x in state.xfers.items():
        if not x.flowing or x.bytes_left <= 0:
            continue
        for r in x.resources:
            if r not in caps:
                caps[r] = capacity(nominal, state.conds, r)
        if all(caps[r] > 0 for r in x.resources):
            flows[k] = x.resources
    used = {r for path in flows.values() for r in path}
    rates = max_min_rates({r: caps[r] for r in used}, flows) if flows else {}
    xfers = {k: msgspec.structs.replace(x, rate=rates.get(k, 0.0)) for k, x in state.xfers.items()}
    return msgspec.structs.replace(state, xfers=xfers)


def evolve_fabric(state: FabricState, event: Event, nominal: Mapping[str, float]) -> FabricState:
    if isinstance(event, FabricFlapSet):
        flaps = dict(state.flaps)
        if event.flap is None:
            flaps.pop(event.link, None)
        else:
            flaps[event.link] = event.flap
        return msgspec.structs.replace(state, flaps=flaps)
    if isinstance(event, FabricFaultRejected):
        return state
    if isinstance(event, FabricXferAccepted):
        x = event.xfer
        state = advance(state, x.accepted_at_s)
        return msgspec.structs.replace(state, xfers={**state.xfers, x.key: x})
    state = advance(state, event.at_s)  # type: ignore[attr-defined]
    xfers = dict(state.xfers)
    if isinstance(event, FabricXferFlowing):
        x = xfers[event.key]
        xfers[event.key] = msgspec.structs.replace(x, flowing=True, bytes_left=float(x.nbytes))
        state = msgspec.structs.replace(state, xfers=xfers)
    elif isinstance(event, FabricXferDelivered):
        x = xfers.pop(event.key)
        state = msgspec.structs.replace(
            state, xfers=xfers, delivered=state.delivered + 1,
            delivered_bytes=state.delivered_bytes + x.nbytes * len(x.targets),
        )  # fmt: skip
    elif isinstance(event, FabricXferFailed):
        del xfers[event.key]
        state = msgspec.structs.replace(state, xfers=xfers, failed=state.failed + 1)
    elif isinstance(event, FabricLinkSet):
        conds = dict(state.conds)
        if event.up and event.bw_factor == 1.0:
            conds.pop(event.link, None)
        else:
            conds[event.link] = LinkCond(event.up, event.bw_factor)
        state = msgspec.structs.replace(state, conds=conds)
    else:
        raise AssertionError(f"fabric: unknown event {type(event).__name__}")
    return rerate(state, nominal)


def finished(x: Xfer, now_s: float, state_now_s: float) -> bool:
    """Whether a flowing transfer has (within rounding) no bytes left at `now_s`."""
    left = x.bytes_left - x.rate * (now_s - state_now_s)
    return left <= max(x.rate * DONE_EPS_S, 0.0)


def next_completion_s(state: FabricState) -> float | None:
    """Delay from `state.now_s` until the first flowing transfer completes."""
    delays = [x.bytes_left / x.rate for x in state.xfers.values() if x.flowing and x.rate > 0]
    return max(0.0, min(delays)) if delays else None


def check_conservation(state: FabricState, nominal: Mapping[str, float]) -> None:
    """No link direction carries more than its capacity; every flow progresses."""
    load: dict[str, float] = {}
    for x in state.xfers.values():
        if not x.flowing or x.bytes_left <= 0:
            continue
        assert x.rate > 0, f"transfer {x.key} is flowing at rate 0"
        for r in x.resources:
            load[r] = load.get(r, 0.0) + x.rate
    for r, total in load.items():
        cap = capacity(nominal, state.conds, r)
        assert total <= cap * (1 + RTOL), f"link {r} carries {total} B/s > capacity {cap} B/s"
