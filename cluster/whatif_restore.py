"""`replay whatif --from T` by restore (issue 32): the driver rebuilt at T from the log, then run on.

The log's steps up to T give every live actor, its state and the timers armed
(replay/fork.py); core/restore.py puts them into a fresh SimDriver with the clock at T. The
external inputs still ahead at T go back in the original driver's order: the faults (injected
after the deployment's t=0 steps), the requests of the windows injected by T (each window is
injected when the original's `run(until=its first arrival)` returned: after as many steps as
have a time up to it) and, later, the windows after T as the what-if's feeder injects them. An
external input's id is the original's (the first request's id is read off the log; the others
follow in injection order). Then the change applies (the root actors whose spawn arguments it
alters are rebuilt, keeping their state, cluster/whatif_fork.py) and the run goes on to its
end, as `sim.run` ends it; the terminal records, decisions and recovery events up to T are the
log's, so the summary counts the whole run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from deepserve.actors.gateway.messages import Refused
from deepserve.actors.workload.messages import RequestDone
from deepserve.actors.workload.metrics import Collector
from deepserve.adapters.scenario.faults import fault_inputs
from deepserve.core import SimDriver
from deepserve.core.envelope import Envelope
from deepserve.core.records import LogSink
from deepserve.core.restore import restore_cell, restore_scheduled, restore_timer, set_clock
from deepserve.replay.common import ReplayError
from deepserve.replay.fork import Cut
from deepserve.replay.inputs import RunInputs

from .run import DRAIN_CHUNK, WINDOW_REQUESTS, RunResult, all_terminal, drain, run_chunk
from .schema import PlatformConfig
from .sim import REPORTERS, STREAM_ADDR, SimEnd, control_plane_busy, recovery_tap, refused_done


def _ext_env(driver: SimDriver, dst: str, msg: Any, corr: str | None, src: str, t: float, msg_id: int) -> Envelope:
    env = driver._external_env(dst, msg, corr, src, t)  # noqa: SLF001 (stamps the input as inject does)
    env.msg_id = msg_id
    return env


def restored_driver(inputs: RunInputs, base: PlatformConfig, cut: Cut, admin: list[tuple[float, str, Any]],
                    sink: LogSink | None = None) -> tuple[SimDriver, int]:  # fmt: skip
    """The original's driver as it was after its last step up to `cut.until_s`, and the index of
    the first window the feeder has still to inject."""
    unsure = cut.unsure()
    if unsure:
        raise ReplayError(f"--from {cut.until_s:g}: {', '.join(unsure[:3])} failed a delivery after its last logged "
                          "output, so its output counter at T is not in the log")  # fmt: skip
    first_id = cut.first_request_id
    if first_id is None:
        raise ReplayError(f"--from {cut.until_s:g}: no request was delivered by then: fork later")
    T = cut.until_s
    driver = SimDriver(base.seed, sink=sink)
    for img in cut.images():
        restore_cell(driver, img)
    faults = [*admin, *fault_inputs(base.faults)]
    cancels = [i for i in inputs.others if i.src not in ("ext/fault", "ext/admin") or i.actor == "cluster"]
    fault_base = first_id - 1 - len(cancels) - len(faults)
    n0 = cut.boundary(0.0, first_id)
    # every pending entry with the position the original queued it at: (steps made, 0, k) for an
    # injection after that many steps, (step, 1, output) for a timer armed by that step
    pending: list[tuple[tuple[int, int, int], Callable[[], None]]] = []
    for k, (at, dst, msg) in enumerate(faults):
        if at > T:
            env = _ext_env(driver, dst, msg, None, "ext/fault", at, fault_base + k + 1)
            pending.append(((n0, 0, k), partial(restore_scheduled, driver, at, env)))
    k0 = len(faults)
    for k, i in enumerate(cancels):
        if i.t > T:
            env = _ext_env(driver, i.actor, i.msg, i.corr, i.src, i.t, fault_base + k0 + k + 1)
            pending.append(((n0, 0, k0 + k), partial(restore_scheduled, driver, i.t, env)))
    reqs = inputs.requests
    window = 0
    while window * WINDOW_REQUESTS < len(reqs) and (window == 0 or reqs[window * WINDOW_REQUESTS].t <= T):
        start = window * WINDOW_REQUESTS
        at_step = n0 if window == 0 else cut.boundary(reqs[start].t, first_id + start)
        for j in range(start, min(start + WINDOW_REQUESTS, len(reqs))):
            i = reqs[j]
            if i.t > T:
                env = _ext_env(driver, i.actor, i.msg, i.corr, i.src, i.t, first_id + j)
                pending.append(((at_step, 0, len(faults) + len(cancels) + j), partial(restore_scheduled, driver, i.t, env)))
        window += 1
    for tm in cut.pending_timers():
        pending.append(((tm.order[0], 1, tm.order[1]), partial(restore_timer, driver, tm.deadline, tm.env, tm.key)))
    pending.sort(key=lambda p: p[0])
    for _pos, put in pending:
        put()
    injected = min(window * WINDOW_REQUESTS, len(reqs))
    set_clock(driver, cut.last_t, first_id - 1 + injected, cut.retired.items())
    return driver, window


def restored_run(inputs: RunInputs, base: PlatformConfig, cfg: PlatformConfig, cut: Cut,
                 admin: list[tuple[float, str, Any]], taps: Sequence[Callable[[SimDriver], None]],
                 changes: dict[str, tuple[type, dict[str, Any]]], forked: list[str],
                 sink: LogSink | None = None, drain_limit_s: float = 24 * 3600.0) -> RunResult:  # fmt: skip
    """The what-if from T: restored, changed, run to its end (module docstring)."""
    from .whatif_fork import gateway_of

    t_start = time.perf_counter()
    driver, window = restored_driver(inputs, base, cut, admin, sink)
    T = cut.until_s
    collector, slo = Collector(), cfg.slo
    attained = [0]
    models = cfg.workload.models or (cfg.cluster.model,)
    by_model = {m: Collector() for m in models} if len(models) > 1 else {}
    model_of = {i.msg.request_id: i.msg.model for i in inputs.requests} if by_model else {}

    def add(msg: Any) -> None:
        collector.add(msg)
        if by_model and (m := model_of.get(msg.request_id)) in by_model:
            by_model[m].add(msg)
        if msg.status == "completed" and msg.first_token_s is not None:
            ttft_ms = (msg.first_token_s - msg.arrival_s) * 1e3
            tpot_ms = (msg.finish_s - msg.first_token_s) * 1e3 / (msg.output_tokens - 1) if msg.output_tokens > 1 else 0.0
            attained[0] += ttft_ms <= slo.ttft_ms and tpot_ms <= slo.tpot_ms

    for t, msg in inputs.terminal:
        if t <= T:
            add(refused_done(msg, t) if type(msg) is Refused else msg)

    def listen(t: float, env: Any) -> None:
        msg = env.msg
        if type(msg) is Refused:
            add(refused_done(msg, t))
        elif type(msg) is RequestDone:
            add(msg)

    driver.on_external = listen
    recovery = [e for e in inputs.recovery_events if e[0] <= T]
    if base.faults:
        driver.invariants.append(recovery_tap(recovery))
    driver.invariants.extend(taps)
    for addr, (cls, kwargs) in sorted(changes.items()):
        cell = driver.cells.get(addr)
        if cell is None or not cell.alive or cell.actor is None:
            continue
        state = cell.actor.state
        cell.actor = cls(**kwargs)
        cell.actor.state = state
        forked.append(addr)
    reqs, gateway = inputs.requests, gateway_of(cfg)
    last = reqs[-1].t if reqs else 0.0
    for start in range(window * WINDOW_REQUESTS, len(reqs), WINDOW_REQUESTS):
        driver.run(until=max(reqs[start].t, driver.now))
        for i in reqs[start:start + WINDOW_REQUESTS]:
            driver.inject(gateway, i.msg, at=max(i.t, driver.now), corr=i.corr, src=i.src)
    if window * WINDOW_REQUESTS >= len(reqs):  # the original was draining at T: finish its chunk first
        k = (window - 1) * WINDOW_REQUESTS
        left = _chunk_left(cut, len(reqs), cut.boundary(reqs[k].t if k else 0.0, (cut.first_request_id or 0) + k))
        if left and collector.terminal < len(reqs):
            run_chunk(driver, all_terminal(collector, len(reqs)), left)  # as the original's (run.py `drain`)
    drain(driver, collector, len(reqs), last + drain_limit_s, gateway, control_plane_busy)
    if driver.pending():
        driver.snapshot_live()
    built = _built(cfg)
    faults = [*admin, *fault_inputs(base.faults)]
    summary: dict[str, Any] = dict(_builtins(collector.summary()))
    end = SimEnd(driver=driver, built=built, cfg=cfg, collector=collector, faults=faults, slo_attained=attained[0],
                 extra_faults=len(admin), recovery_events=recovery, by_model=by_model)  # fmt: skip
    for report in REPORTERS:
        report(end, summary)
    return RunResult(summary=summary, deliveries=cut.delivered + driver.deliveries, virtual_time_s=driver.now,
                     wall_s=time.perf_counter() - t_start, injected=len(reqs), workload={})  # fmt: skip


def _chunk_left(cut: Cut, injected: int, fed_at_step: int) -> int:
    """What is left at T of the drain's chunk in progress (run.py `drain`: chunks of deliveries
    sized by the requests still open at each chunk's start, counted from the end of the feed)."""
    from bisect import bisect_right

    d = cut.delivered_at(fed_at_step)
    while True:
        open_now = injected - bisect_right(cut.terminal_at, d)
        if open_now <= 0:
            return 0
        d += min(DRAIN_CHUNK, 64 + 16 * open_now)
        if d > cut.delivered:
            return d - cut.delivered


def _builtins(x: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(x)


def _built(cfg: PlatformConfig) -> Any:
    from .whatif_fork import built_of

    return built_of(cfg)


__all__ = ["restored_driver", "restored_run", "STREAM_ADDR"]
