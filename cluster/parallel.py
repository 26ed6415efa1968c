"""A simulation split by server across worker processes (`deepserve sim --workers N`).

In a colocated cluster fed round-robin, no request's work leaves the server of its TE: its
task, its forwards, its KV and its DRAM-tier copies stay on that server's NPUs, host and links.
So the servers fall into independent groups, and each group can be simulated on its own core:
a worker process builds the fabric (the whole topology, only its servers' flows ever reach it),
its servers' hosts and NPUs, their TEs and a workload actor over just those TEs, and is fed the
trace's requests that the whole run's round-robin gives those TEs. Every actor keeps its address,
and its random stream is seeded from the run seed, its address and its own delivery count, so it
sees the same inputs at the same times as in the whole run and answers the same: the per-request
results are the whole run's, bit for bit (tests/adapters/test_scenario_parallel.py), and so are
the metrics, computed over the union of the workers' terminal records. The plan (which servers
each worker takes, its requests, its log's name) is data: adapters/scenario/partition.py.

Injection windows are kept at the whole run's points of the trace (`run.arrivals(select=...)`), so
that ties in virtual time resolve in the same order. Each worker writes its own log, one file per
worker in a run directory under one run id, which `deepserve replay verify DIR` checks file by
file (as it does a `deepserve up --processes` run).

What is not split: PD mode (the KV crosses servers), a `[scheduling]` section (the JE's policies
read every TE's load), a cluster on one server. Those are refused with the reason.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, wait
from typing import Any

import msgspec

from deepserve.actors.workload.messages import RequestDone
from deepserve.actors.workload.metrics import Collector
from deepserve.adapters.hardware.devices.topology import build
from deepserve.adapters.scenario.partition import Partition, selector
from deepserve.adapters.scenario.placement import Placement, place
from deepserve.adapters.scenario.schema import Scenario

from .assembly import spawn_workload
from .run import RunResult, run_scenario
from .te import spawn_te

WORKER_GC_GEN0_THRESHOLD = 100_000  # the cyclic GC's first threshold in a worker (`_worker`)
PROGRESS_EVERY = 64  # terminal requests between a worker's progress messages
WORKLOAD_COUNTERS = ("arrived", "completed", "failed", "cancelled", "duplicates")


class WorkerError(RuntimeError):
    """A worker failed: `kind` is the exception's type name (a bad trace row in a worker is
    the same `TraceError` the whole run would raise; the CLI maps it back)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def build_partition(part: Partition) -> Callable[[Any, Scenario], Placement]:
    """A `run_scenario` builder for one partition: its servers' hardware, TEs and workload."""

    def build_it(driver: Any, scenario: Scenario) -> Placement:
        from deepserve.adapters.hardware.devices.topology import spawn_topology

        c = scenario.cluster
        whole = place(c)
        spawn_topology(driver, build(c.topology, whole.servers), variance=c.npu_variance,
                       servers=part.servers)  # fmt: skip
        own = Placement(whole.servers, tuple(t for t in whole.tes if t.server in part.servers))
        for te in own.tes:
            spawn_te(driver, scenario, te)
        spawn_workload(driver, scenario, own, direct=c.dp_groups == 1)
        return own

    return build_it


class WorkerResult(msgspec.Struct):
    deliveries: int
    virtual_time_s: float
    injected: int
    workload: dict[str, int]
    done: list[RequestDone]


class WorkerMsg(msgspec.Struct, omit_defaults=True):
    """What a worker says on its pipe: progress (terminal requests since the last), its
    result, or its failure."""

    kind: str  # "progress", "result" or "error"
    n: int = 0
    result: WorkerResult | None = None
    error: str = ""  # the exception's type name
    text: str = ""


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(WorkerMsg).decode


def _worker(conn: Connection, scenario: Scenario, trace: str, requests: int | None,
            part: Partition, log: str | None, inherited: list[Connection]) -> None:  # fmt: skip
    """One partition, in a forked process; reports progress, then its result, on `conn`.
    `inherited`: the pipes' read ends the fork copied; closed at once, so that a dead parent
    leaves no reader of this worker's pipe and the worker's next send fails."""
    for other in inherited:
        other.close()
    # The parent's objects are long-lived here: kept out of the collector (what Python's gc
    # docs advise for a forked child), and young objects collected 10x less often than the
    # CLI's threshold: the collector's CPU in a worker of 3,000 Mooncake requests went from
    # 0.17 s to 0.085 s (~3 % -> ~1.5 %, measured with gc.callbacks). A worker is ours alone.
    gc.freeze()
    gc.set_threshold(WORKER_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    try:
        from deepserve.persistence import open_sink

        done: list[RequestDone] = []

        def on_done(d: RequestDone) -> None:
            done.append(d)
            if len(done) % PROGRESS_EVERY == 0:
                conn.send_bytes(_encode(WorkerMsg("progress", PROGRESS_EVERY)))

        sink = open_sink(log, "async", writer="process") if log is not None else None
        try:
            r = run_scenario(scenario, build=build_partition(part), trace=trace, requests=requests,
                             sink=sink, on_done=on_done, select=selector(scenario, part),
                             config_note={"partition": msgspec.to_builtins(part)})  # fmt: skip
        finally:
            if sink is not None:
                sink.close()
        conn.send_bytes(_encode(WorkerMsg("progress", len(done) % PROGRESS_EVERY)))
        out = WorkerResult(r.deliveries, r.virtual_time_s, r.injected, r.workload, done)
        conn.send_bytes(_encode(WorkerMsg("result", result=out)))
    except BaseException as exc:  # reported to the parent, which decides how to fail
        detail = str(exc) if isinstance(exc, ValueError) else f"sim worker w{part.index}: {exc!r}"
        if os.environ.get("DEEPSERVE_DEBUG"):
            traceback.print_exc()  # the worker's own traceback; the parent's says only where it heard
        with contextlib.suppress(OSError):  # a parent gone (killed) reads nothing more
            conn.send_bytes(_encode(WorkerMsg("error", error=type(exc).__name__, text=detail)))
    finally:
        conn.close()


def run_parallel(
    scenario: Scenario, parts: list[Partition], *, trace: str, requests: int | None,
    logs: list[str] | None, on_progress: Callable[[int], None] | None = None,
    on_done: Callable[[RequestDone], None] | None = None,
) -> RunResult:  # fmt: skip
    """Run every partition in its own process (fork) and merge their results as the whole run's.
    `logs`: one log target per partition, or None for no log. `on_progress(n)`: n more requests
    ended (as the workers run); `on_done`: each terminal record, once all have ended."""
    assert logs is None or len(logs) == len(parts)
    ctx = multiprocessing.get_context("fork")  # the parent's imports and compiled modules, at once
    t0 = time.perf_counter()
    _import_before_fork(with_log=logs is not None)
    procs: list[Any] = []
    conns: dict[Connection, int] = {}
    try:
        with _terminate_as_exit():
            for part in parts:
                recv, send = ctx.Pipe(duplex=False)
                log = logs[part.index] if logs is not None else None
                # The fork copies every pipe end open now: the worker closes the read ends
                # (its own and the earlier workers'), so the parent is its pipe's only reader.
                p = ctx.Process(target=_worker, name=f"deepserve-sim-w{part.index}",
                                args=(send, scenario, trace, requests, part, log, [*conns, recv]))  # fmt: skip
                p.start()
                send.close()
                procs.append(p)
                conns[recv] = part.index
            results = _collect(conns, procs, on_progress)
    finally:
        for p in procs:  # an interrupted or failed run leaves no worker behind
            if p.is_alive():
                p.terminate()
            p.join()
        for conn in conns:
            conn.close()
    if on_done is not None:
        for i in sorted(results):
            for d in results[i].done:
                on_done(d)
    return _merge(results, time.perf_counter() - t0)


def _import_before_fork(*, with_log: bool) -> None:
    """Import what every worker would otherwise import after the fork, each on its own: the
    devices and the TE's actors (imported when first built) and the log's writer side
    (SQLAlchemy), ~0.4 s of each worker's start on the full trace's bench (measured)."""
    import deepserve.actors.flowserve.te_shell
    import deepserve.adapters.hardware.devices.fabric
    import deepserve.adapters.hardware.devices.host
    import deepserve.adapters.hardware.devices.npu  # noqa: F401

    if with_log:
        import deepserve.persistence.factory  # noqa: F401


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) while the workers run (in the main thread), so that
    `run_parallel`'s `finally` stops them: killed at once, the parent would leave them running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_on_term(_signum: int, _frame: Any) -> None:
        _TERMINATED.append(signal.SIGTERM)  # seen by `_collect` if this raise is swallowed
        raise SystemExit(128 + signal.SIGTERM)

    before = signal.signal(signal.SIGTERM, exit_on_term)
    _TERMINATED.clear()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


# A SIGTERM that arrived while the workers ran. Its handler's SystemExit is lost when the signal
# lands in code whose exceptions Python ignores (a gc callback: "Exception ignored in ..."), and
# the stepwise run then went on for minutes (a CI run): `_collect` checks this as well.
_TERMINATED: list[int] = []
TERM_POLL_S = 0.5


def _collect(conns: dict[Connection, int], procs: list[Any],
             on_progress: Callable[[int], None] | None) -> dict[int, WorkerResult]:  # fmt: skip
    results: dict[int, WorkerResult] = {}
    while conns:
        ready = wait(list(conns), timeout=TERM_POLL_S)
        if _TERMINATED:
            raise SystemExit(128 + signal.SIGTERM)
        for conn in ready:
            assert isinstance(conn, Connection)
            i = conns[conn]
            try:
                data = conn.recv_bytes()
            except EOFError:
                del conns[conn]
                conn.close()
                if i not in results:
                    procs[i].join()
                    raise WorkerError("WorkerDied", f"sim worker w{i} exited "
                                      f"(exit code {procs[i].exitcode}) before its result") from None  # fmt: skip
                continue
            msg = _decode(data)
            if msg.kind == "progress":
                if on_progress is not None and msg.n:
                    on_progress(msg.n)
            elif msg.kind == "error":
                raise WorkerError(msg.error, msg.text)
            else:
                assert msg.result is not None
                results[i] = msg.result
    return results


def _merge(results: dict[int, WorkerResult], wall_s: float) -> RunResult:
    done = [d for i in sorted(results) for d in results[i].done]
    return RunResult(
        summary=msgspec.to_builtins(Collector().extend(done).summary()),
        deliveries=sum(r.deliveries for r in results.values()),
        virtual_time_s=max(r.virtual_time_s for r in results.values()),
        wall_s=wall_s,
        injected=sum(r.injected for r in results.values()),
        workload={k: sum(r.workload[k] for r in results.values()) for k in WORKLOAD_COUNTERS},
    )


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
