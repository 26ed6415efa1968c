"""`deepserve bench devices`: the emulated fabric under many concurrent transfers, each row
beside the same workload at a tenth of the flows, measured in the same run.

- fabric_flows_N_s: N transfers between random die pairs of a CloudMatrix384 SuperPod (UB),
  all injected at t = 0, run to the last answer in SimDriver (no log sink: the fabric's own
  cost), wall seconds.
- fabric_steady_deliveries_per_s: a client keeps N transfers in flight (each answer starts
  another between a random pair), transfers delivered per wall second once warmed up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from deepserve.actors.ports.link import LinkTransfer, LinkTransferDone, LinkTransferFailed
from deepserve.adapters.hardware.devices.fabric import Fabric
from deepserve.adapters.hardware.devices.topology import FABRIC
from deepserve.benchmarks.table import Row
from deepserve.core import Actor, Context, Event, Message, SimDriver

Progress = Callable[[str], None]
SERVERS = 48  # a whole CloudMatrix384: 768 dies
MIB = 1 << 20


def _die(index: int) -> str:
    return f"hw/s{index // 16}/npu{index % 16}"  # a cm384 server has 16 dies


DIES = SERVERS * 16


def _pair(rng: random.Random) -> tuple[str, str]:
    a = rng.randrange(DIES)
    b = (a + 1 + rng.randrange(DIES - 1)) % DIES  # any other die
    return _die(a), _die(b)


def _driver() -> SimDriver:
    d = SimDriver(seed=1)
    d.spawn(FABRIC, Fabric, cluster="cm384", servers=SERVERS)
    d.run()
    return d


def burst_s(flows: int) -> float:
    """Wall seconds to run `flows` concurrent UB transfers to completion."""
    d, rng = _driver(), random.Random(flows)
    for i in range(flows):
        src, dst = _pair(rng)
        nbytes = rng.randint(64 * MIB, 1024 * MIB)
        d.inject(FABRIC, LinkTransfer(req_id=f"b{i}", src=src, dst=dst, nbytes=nbytes), src="ext/bench")
    t0 = time.perf_counter()
    d.run()
    wall = time.perf_counter() - t0
    done = sum(isinstance(env.msg, LinkTransferDone) for _, env in d.external_out)
    if done != flows:
        raise RuntimeError(f"bench: {done} of {flows} transfers answered")
    return wall


class Go(Message, frozen=True):
    flows: int


class Delivered(Event, frozen=True):
    pass


class KeepBusy(Actor[int]):
    """Keeps `flows` transfers in flight: every answer starts another between a random pair."""

    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: Event) -> int:
        return state + 1

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, Go):
            for _ in range(msg.flows):
                self._start(ctx)
        elif isinstance(msg, LinkTransferDone):
            ctx.record(Delivered())
            self._start(ctx)
        elif isinstance(msg, LinkTransferFailed):
            raise RuntimeError(f"bench: transfer failed: {msg.reason}")

    def _start(self, ctx: Context) -> None:
        src, dst = _pair(ctx.rng)
        nbytes = ctx.rng.randint(16 * MIB, 256 * MIB)
        ctx.send(FABRIC, LinkTransfer(req_id=ctx.new_id(), src=src, dst=dst, nbytes=nbytes))


def steady_per_s(flows: int, deliveries: int) -> float:
    """Transfers delivered per wall second with `flows` in flight, after `flows` warm-up."""
    d = _driver()
    d.spawn("bench/client", KeepBusy)
    d.inject("bench/client", Go(flows), src="ext/bench")
    d.run(max_deliveries=2)  # the client starts
    client = d.actor("bench/client")

    def run_to(count: int) -> None:
        while client.state < count:
            if not d.run(max_deliveries=256):
                raise RuntimeError("bench: the fabric went idle")

    run_to(flows)
    start, t0 = client.state, time.perf_counter()
    run_to(flows + deliveries)
    return (client.state - start) / (time.perf_counter() - t0)


def devices_bench(flows: int = 1000, progress: Progress | None = None) -> tuple[str, list[Row]]:
    if flows < 10:
        raise ValueError(f"flows: need at least 10, got {flows}")
    base = flows // 10
    rows = []
    if progress is not None:
        progress(f"{flows} concurrent UB transfers")
    big, small = burst_s(flows), burst_s(base)
    rows.append(Row(f"fabric_flows_{flows}_s", big, "s",
                    f"fabric_flows_{base}_s (same workload, {base} flows)", small))
    if progress is not None:
        progress(f"steady state at {flows} flows in flight")
    many, few = steady_per_s(flows, 10 * flows), steady_per_s(base, 10 * flows)
    rows.append(Row("fabric_steady_deliveries_per_s", many, "deliveries/s",
                    f"fabric_steady_deliveries_per_s at {base} flows", few))
    title = f"deepserve bench devices (CloudMatrix384 UB fabric, {SERVERS * 16} dies, SimDriver, no log)"
    return title, rows
