"""A TE's OS process (processes mode): `python -m deepserve.daemon.procs.te_host`, its
`HostSpec` as JSON on stdin.

It runs the TE's NPUs and the pod agent on its own `AsyncDriver` (wall clock, the run's shared
epoch) with a ZeroMQ transport bound at the spec's endpoint, writes its own SQLite log in the
run directory, prints `ready <endpoint>` once bound, and from then on is driven by messages:
the launcher's `BootPod` starts the TE's bootstrap (TE-Pre-Load, weights, the TE shell and its
DP masters, `RegisterTe`). SIGTERM stops it cleanly (final snapshots, the transport flushed and
acknowledged, the log flushed); SIGINT is the main process's to handle. It exits when its
parent does (Linux: PR_SET_PDEATHSIG; elsewhere a watchdog): a TE process never outlives the
daemon. Every half second it writes its DP masters' loads to `status_path` (read-only: what
`deepserve status` shows) and its NPUs' timer lateness (for /metrics), never touching actor state.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
from collections import deque
from typing import Any

import msgspec
import structlog

from deepserve.actors.ports.pod import TeSlot

STATUS_EVERY_S = 0.5
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


class HostSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pod_id: str
    generation: int
    slot: TeSlot
    run_id: str
    seed: int
    epoch: float  # the run's t=0 (wall clock), shared by every process of the run
    log_path: str
    endpoint: str  # where this process binds its transport
    main_endpoint: str
    main_prefixes: tuple[str, ...]  # the main process's address prefixes
    npu_kind: str
    variance: bool = True
    parent_pid: int
    status_path: str = ""
    log_format: str = "console"
    close_timeout_s: float = 2.0
    # The frontend's address (`ext/stream`): the DP masters' token batches go from here to the
    # main process directly, over this process's transport (the output short-circuit)
    stream_to: str = ""


def _die_with_parent(parent_pid: int) -> None:
    """SIGTERM when the parent dies (Linux); if it died already, go now."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:
        raise SystemExit(3)


def _configure_logging(fmt: str) -> None:
    renderer: Any = (structlog.processors.JSONRenderer() if fmt == "json"
                     else structlog.dev.ConsoleRenderer(colors=False))  # fmt: skip
    structlog.configure(processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                                    renderer], logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # fmt: skip


def loads_of(driver: Any, slot: TeSlot) -> list[dict[str, Any]]:
    """Each DP master's load, read from its live state (no message, nothing recorded)."""
    from deepserve.actors.flowserve.master.status import dp_load

    out: list[dict[str, Any]] = []
    for i in range(slot.dp_groups):
        addr = f"{slot.te}/dp/{i}"
        cell = driver.cells.get(addr)
        if cell is None or not cell.alive or cell.actor is None:
            out.append({"master": addr, "alive": False})
            continue
        ld = dp_load(cell.actor.state, cell.actor.cfg)
        out.append({"master": addr, "alive": True, **msgspec.to_builtins(ld)})
    return out


def _write_status(spec: HostSpec, driver: Any, lateness: Any = None) -> None:
    if not spec.status_path:
        return
    body = {"pod_id": spec.pod_id, "te": spec.slot.te, "generation": spec.generation, "pid": os.getpid(),
            "at_s": driver.clock(), "dps": loads_of(driver, spec.slot)}  # fmt: skip
    if lateness is not None:  # the NPUs' timer lateness (daemon/metrics.py: Lateness), for /metrics
        body["npu_timer_lateness"] = lateness.snapshot()
    tmp = spec.status_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, spec.status_path)


async def _watch(spec: HostSpec, driver: Any, stop: asyncio.Event, lateness: Any = None) -> None:
    """Status every `STATUS_EVERY_S`; stop when the parent is gone (the watchdog beside PDEATHSIG)."""
    while not stop.is_set():
        if os.getppid() != spec.parent_pid:
            stop.set()
            return
        with contextlib.suppress(OSError, TypeError, ValueError):
            _write_status(spec, driver, lateness)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(STATUS_EVERY_S, PARENT_POLL_S))


async def serve_pod(spec: HostSpec) -> None:
    from deepserve.adapters.hardware.devices.npu import Npu
    from deepserve.adapters.zmq import Limits, ZmqTransport
    from deepserve.core.asyncdriver import AsyncDriver
    from deepserve.persistence import open_sink

    from .launcher import PodAgent
    from .messages import PeerRoutes
    from .routes import apply_peer_routes

    log = structlog.get_logger("deepserve.procs").bind(actor=spec.slot.te, pod=spec.pod_id)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    te = spec.slot.te
    routes = {p: spec.main_endpoint for p in spec.main_prefixes}
    if spec.stream_to:
        routes[spec.stream_to] = spec.main_endpoint
    transport = ZmqTransport(bind=spec.endpoint, routes=routes, limits=Limits(close_timeout_s=spec.close_timeout_s))
    own = (te, f"{te}/")
    applied = [-1]

    def on_external(_t: float, env: Any) -> None:
        msg = env.msg
        if env.dst == spec.stream_to:  # to the frontend, in the main process: no hop through the JE
            if not transport.send(env):
                log.warning("token batch refused by the transport", dst=env.dst)
        elif isinstance(msg, PeerRoutes) and msg.version > applied[0]:
            applied[0] = msg.version
            problem = apply_peer_routes(transport.directory, msg, transport.endpoint or "", own)
            if problem:
                log.error("directory entry refused", error=problem)

    # as the main process's log (runtime.LOG_LINGER_S, LOG_FLUSH_S, LOG_CACHE_KIB)
    sink = open_sink(spec.log_path, "async", linger_s=0.02, flush_s=0.25, cache_kib=8192)
    config = {"pod_id": spec.pod_id, "te": te, "generation": spec.generation, "endpoint": spec.endpoint}
    d = AsyncDriver(seed=spec.seed, sink=sink, transport=transport, epoch=spec.epoch, run_id=spec.run_id,
                    config=config, mailbox_capacity=65_536)  # fmt: skip
    d.external_out = deque(maxlen=0)  # what goes outside is handled here, not kept (RSS)
    d.on_external = on_external
    from ..metrics import Lateness

    lateness = Lateness()
    d.timer_late = lateness.observe
    try:
        async with d:
            for npu in spec.slot.npus:
                d.spawn(npu, Npu, npu=spec.npu_kind, variance=spec.variance)
            d.spawn(f"{te}/pod", PodAgent, te=te)
            print(f"ready {transport.endpoint}", flush=True)
            os.dup2(2, 1)  # nothing else goes to the supervisor's pipe
            log.info("TE process up", pid=os.getpid(), endpoint=transport.endpoint, log=spec.log_path)
            await _watch(spec, d, stop, lateness)
            log.info("TE process stopping", pid=os.getpid())
    finally:
        sink.close()


def python_start() -> None:
    """Every import a TE process needs, before its spec: what a pre-warmed process has done
    when a scale-out claims it (the TE shell and DP masters too, which the bootstrap would
    import later). The same in a cold process, so `python_start` measures the same work."""
    import deepserve.actors.cluster.boot
    import deepserve.actors.cluster.responder
    import deepserve.actors.flowserve.te_shell
    import deepserve.adapters.hardware.devices.npu
    import deepserve.adapters.zmq
    import deepserve.core.asyncdriver
    import deepserve.daemon.metrics
    import deepserve.daemon.procs.launcher
    import deepserve.persistence  # noqa: F401


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the daemon's: it stops us in order
    warm = "--warm" in sys.argv[1:]
    if warm:  # pre-warmed: die with the daemon from now on, not only once a spec names it
        _die_with_parent(os.getppid())
    python_start()
    if warm:
        print("warm", flush=True)  # then wait, unassigned, for the spec of the pod that claims us
    try:
        spec = msgspec.json.decode(sys.stdin.buffer.read(), type=HostSpec)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"te_host: bad spec on stdin: {exc}", file=sys.stderr)
        return 2
    _die_with_parent(spec.parent_pid)
    _configure_logging(spec.log_format)
    from deepserve.core.asyncdriver import run

    run(serve_pod, spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
