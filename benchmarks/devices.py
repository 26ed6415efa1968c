"""`deepserve bench devices`: the emulated fabric under many concurrent transfers, each row
beside the same workload at a tenth of the flows, measured in the same run.

- fabric_flows_N_s: N transfers between random die pairs of a CloudMatrix384 SuperPod (UB),
  all injected at t = 0, run to the last answer in SimDriver (no log sink: the fabric's own
  cost), wall seconds; fabric_flows_N_cpu_s: the same run in CPU seconds of this process
  (`time.process_time`), which a loaded machine does not inflate.
- fabric_steady_*: a client keeps N transfers in flight (each answer starts another between
  a random pair); measured once warmed up (N transfers completed), over 10 x N more.
  A *delivery* is what it is in `deepserve bench kernel` (sim_deliveries_per_s): one message
  the kernel delivers to an actor, counted by the driver (`SimDriver.deliveries`). One
  transfer costs about four: the request to the fabric, the fabric's tick that ends its
  setup, the tick that ends its flow (ticks are shared by transfers due at the same
  instant), and the answer to the client. A *transfer* is one completed LinkTransfer.
  `..._per_s` rows divide by wall seconds, `..._per_cpu_s` rows by CPU seconds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from msgspec import Struct

from deepserve.actors.ports.link import LinkTransfer, LinkTransferDone, LinkTransferFailed
from deepserve.adapters.hardware.devices.fabric import Fabric
from deepserve.adapters.hardware.devices.topology import FABRIC
from deepserve.benchmarks.devices_npu import npu_rows
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


def burst_s(flows: int) -> tuple[float, float]:
    """(wall, CPU) seconds to run `flows` concurrent UB transfers to completion."""
    d, rng = _driver(), random.Random(flows)
    for i in range(flows):
        src, dst = _pair(rng)
        nbytes = rng.randint(64 * MIB, 1024 * MIB)
        d.inject(FABRIC, LinkTransfer(req_id=f"b{i}", src=src, dst=dst, nbytes=nbytes), src="ext/bench")
    t0, c0 = time.perf_counter(), time.process_time()
    d.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    done = sum(isinstance(env.msg, LinkTransferDone) for _, env in d.external_out)
    if done != flows:
        raise RuntimeError(f"bench: {done} of {flows} transfers answered")
    return wall, cpu


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


class Steady(Struct, frozen=True):
    """Rates of one steady-state run (see the module docstring for the units)."""

    deliveries_per_s: float
    transfers_per_s: float
    deliveries_per_cpu_s: float
    transfers_per_cpu_s: float


def steady(flows: int, transfers: int) -> Steady:
    """Kernel deliveries and completed transfers per wall and CPU second with `flows` in
    flight, over `transfers` completions after `flows` warm-up completions."""
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
    start, delivered = client.state, d.deliveries
    t0, c0 = time.perf_counter(), time.process_time()
    run_to(flows + transfers)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_transfers, n_deliveries = client.state - start, d.deliveries - delivered
    return Steady(
        deliveries_per_s=n_deliveries / wall, transfers_per_s=n_transfers / wall,
        deliveries_per_cpu_s=n_deliveries / cpu, transfers_per_cpu_s=n_transfers / cpu,
    )  # fmt: skip


def devices_bench(flows: int = 1000, progress: Progress | None = None) -> tuple[str, list[Row]]:
    if flows < 10:
        raise ValueError(f"flows: need at least 10, got {flows}")
    base = flows // 10
    rows = []
    if progress is not None:
        progress(f"{flows} concurrent UB transfers")
    (big, big_cpu), (small, small_cpu) = burst_s(flows), burst_s(base)
    rows.append(Row(f"fabric_flows_{flows}_s", big, "s",
                    f"fabric_flows_{base}_s (same workload, {base} flows)", small))
    rows.append(Row(f"fabric_flows_{flows}_cpu_s", big_cpu, "CPU s",
                    f"fabric_flows_{base}_cpu_s (same workload, {base} flows)", small_cpu))
    if progress is not None:
        progress(f"steady state at {flows} flows in flight")
    many, few = steady(flows, 10 * flows), steady(base, 10 * flows)
    units = {"deliveries": "deliveries", "transfers": "transfers"}
    for what, unit in units.items():
        for per, label in (("s", "/s"), ("cpu_s", "/CPU s")):
            name = f"fabric_steady_{what}_per_{per}"
            field = f"{what}_per_{per}"
            rows.append(Row(name, getattr(many, field), unit + label,
                            f"{name} at {base} flows", getattr(few, field)))
    # the NPU's aggregated decode runs (devices_npu.py), scaled with --flows: 40 runs at 1,000
    rows += npu_rows(progress, runs=max(2, flows // 25))
    title = f"deepserve bench devices (CloudMatrix384 UB fabric, {SERVERS * 16} dies, SimDriver, no log)"
    return title, rows
