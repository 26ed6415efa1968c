"""`deepserve sim` on the whole platform: the assembly in a `SimDriver`, a trace fed to the
gateway as `ApiRequest`s at their arrival times, run until every injected request is terminal.

Arrivals come in windows (run.py's `arrivals`, `WINDOW_REQUESTS`): a trace is
read as the run goes, never whole in memory. The control plane's timers (heartbeats) keep the
heap alive forever, so the loop watches the count of terminal requests, not the heap; a cluster
that stops making progress for `drain_limit_s` of virtual time after the last arrival gets an
`EndOfRun`, which fails what is left, recorded.

At the end, each function of `REPORTERS` adds its keys to the summary from the final state
(the cluster manager's TEs, the faults injected); a caller may pass its own list. A run with
`[[faults]]` also keeps, as it goes, the few events the recovery accounting reads
(actors/cluster/recovery_report.py `EVENT_TYPES`, off each step as it is delivered: the same
whether a log is written or not), and reports a line per fault (`faults`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from deepserve.actors.cluster.recovery_report import EVENT_TYPES, recovery_report
from deepserve.actors.gateway.messages import REFUSED_429, ApiRequest, Refused
from deepserve.actors.workload.messages import METRICS_ADDR, RequestDone
from deepserve.actors.workload.metrics import Collector, percentile
from deepserve.adapters.scenario.faults import fault_inputs
from deepserve.adapters.scenario.schema import Scenario
from deepserve.core import Message, SimDriver
from deepserve.core.records import LogSink

from .assembly import MANAGER_ADDR, Built, assemble
from .autoscale import autoscale_report
from .config import for_driver
from .run import WINDOW_REQUESTS, RunResult, arrivals, drain, run_scenario
from .schema import PlatformConfig

# Where the DP masters stream each pass's tokens, as to the daemon's frontend (xDeepServe §4.2's
# output short-circuit): one `TokenBatch` a pass, not a `TaskTokens` a task and pass to the JE,
# which hears of each task's first chunk only (it must know what a client has seen). The run reads
# timings from the terminal records, so the batches go outside unread.
STREAM_ADDR = "ext/stream"
REDACTED = "<redacted>"
Reporter = Callable[["SimEnd", dict[str, Any]], None]
# (driver, the gateway's address, request id -> model to fill or None) -> (injected, last arrival)
Feed = Callable[[SimDriver, str, "dict[str, str] | None"], tuple[int, float]]


class SimEnd(msgspec.Struct, kw_only=True):
    """What a reporter reads at the end of a run."""

    driver: Any  # the SimDriver, its actors' final state
    built: Built
    cfg: PlatformConfig
    collector: Any  # the run's Collector (every terminal request)
    faults: list[tuple[float, str, Message]]  # every fault input scheduled
    extra_faults: int = 0  # of which the first `extra_faults` came from the caller, not `[[faults]]`
    recovery_events: list[tuple[float, str, Any]] = []  # (t, actor, event) the recovery report reads
    slo_attained: int
    by_model: dict[str, Any] = {}  # model -> its requests' Collector (several models only)


def _cluster_report(end: SimEnd, out: dict[str, Any]) -> None:
    """The control plane's view at the end: TEs ready against the groups' targets, replacements
    that reached ready (`recoveries`), faults delivered."""
    cell = end.driver.cells.get(MANAGER_ADDR)
    st = cell.actor.state if cell is not None and cell.actor is not None else None
    tes = st.tes if st is not None else {}
    out["tes_ready_at_end"] = sum(1 for r in tes.values() if r.state == "ready")
    out["tes_target"] = sum(g.target for g in st.groups.values()) if st is not None else 0
    out["recoveries"] = sum(
        sum(1 for h in r.history if int(h["generation"]) > 1 and "registered" in h.get("steps", {}))  # type: ignore[arg-type, operator]
        + (r.generation > 1 and "registered" in r.steps)
        for r in tes.values()
    )  # fmt: skip
    # A fault is one scheduled fault, not its inputs (a kill-je or a link flap is several): each
    # `[[faults]]` entry due by the end, and each input a caller passed
    now = end.driver.now
    out["faults_injected"] = (sum(1 for f in end.cfg.faults if f.at_s <= now)
                              + sum(1 for at, _, _ in end.faults[:end.extra_faults] if at <= now))  # fmt: skip


def _fault_report(end: SimEnd, out: dict[str, Any]) -> None:
    """A line per `[[faults]]` entry injected: detected after, recovered after, the requests it
    failed or had retried (actors/cluster/recovery_report.py)."""
    if not end.cfg.faults:
        return
    npus_of = {s.te: s.npus for s in end.built.slots}
    # (a frozen FaultSpec's fields are read-only; the report's FaultLike protocol only reads them)
    report = recovery_report(end.cfg.faults, end.recovery_events, npus_of, until_s=end.driver.now)  # type: ignore[arg-type]
    out["faults"] = [msgspec.to_builtins(line) for line in report.lines]


def _latency_report(end: SimEnd, out: dict[str, Any]) -> None:
    c = end.collector
    everyone = sorted(c.e2e_ms + c.failed_e2e_ms)
    out["e2e_ms_p99_all"] = percentile(everyone, 99)
    out["slo_attainment"] = end.slo_attained / c.terminal if c.terminal else 0.0
    out["slo_ttft_ms"], out["slo_tpot_ms"] = end.cfg.slo.ttft_ms, end.cfg.slo.tpot_ms


def _model_report(end: SimEnd, out: dict[str, Any]) -> None:
    """Several models in one cluster: each one's counts and p99 latencies."""
    if not end.by_model:
        return
    keys = ("requests", "completed", "failed", "ttft_ms_p99", "tpot_ms_p99", "e2e_ms_p99")
    out["by_model"] = {m: {k: getattr(s, k) for k in keys} for m, s in ((m, c.summary()) for m, c in end.by_model.items())}


REPORTERS: list[Reporter] = [_cluster_report, _latency_report, _model_report, _fault_report, autoscale_report]


def recovery_tap(into: list[tuple[float, str, Any]]) -> Callable[[SimDriver], None]:
    """A per-step checker (`SimDriver.invariants`) keeping the recovery report's events of each
    delivery, as `recovery_events` reads them off a log."""

    def tap(driver: SimDriver) -> None:
        cell = driver.step_cell
        for ev in cell.ctx.events:
            if type(ev).__name__ in EVENT_TYPES:
                into.append((driver.now, cell.addr, ev))

    return tap


def dispatcher_scenario(cfg: PlatformConfig) -> Scenario:
    """The first group as the dispatcher variant runs it: no `[scheduling]` (no gateway, JE nor
    control plane; what `--workers N` splits over processes)."""
    return msgspec.structs.replace(cfg.scenario(), scheduling=None)


def refused_done(m: Refused, now: float) -> RequestDone:
    """The gateway's refusal as the run's terminal record of the request (nothing ran)."""
    return RequestDone(request_id=m.request_id, status="failed", reason=f"{REFUSED_429}{m.reason}", arrival_s=now,
                       first_token_s=None, finish_s=now, prompt_tokens=0, cached_prompt_tokens=0, output_tokens=0,
                       te="")  # fmt: skip


# TE states the control plane is still working on (actors/cluster/messages.py `TeStateName`)
_SETTLING = ("starting", "replacing", "draining")


def control_plane_busy(driver: SimDriver) -> bool:
    """Whether the cluster manager is still at work: a TE starting, being replaced or drained,
    each bounded by the control plane's own timeouts. The run does not end before it is done
    (run.py `drain`). A failed TE waiting out its boot backoff is not: its slot retries for as
    long as the group wants it (policy.BootBackoff), which a slot that can never boot never ends."""
    cell = driver.cells.get(MANAGER_ADDR)
    st = cell.actor.state if cell is not None and cell.actor is not None else None
    if st is None:
        return False
    return any(r.state in _SETTLING for r in st.tes.values())


def run(
    cfg: PlatformConfig, *, trace: str | None = None, requests: int | None = None, sink: LogSink | None = None,
    on_done: Callable[[RequestDone], None] | None = None, faults: Sequence[tuple[float, str, Message]] = (),
    drain_limit_s: float = 24 * 3600.0, reporters: Sequence[Reporter] | None = None,
    on_end: Callable[[SimDriver], None] | None = None, feed: Feed | None = None,
    taps: Sequence[Callable[[SimDriver], None]] = (), forced: dict[str, str] | None = None,
) -> RunResult:  # fmt: skip
    """Run `cfg`'s cluster on its workload to completion; `result.summary` holds the metrics and
    every reporter's keys (the platform's; `scheduling.entry = "dispatcher"` runs the assembly's
    dispatcher variant, whose summary has the workload's metrics only). `sink` is not closed.
    A what-if (replay/whatif.py) replays a recorded run's requests: `feed` injects them instead of
    the trace's, `taps` see each delivery, `forced` (task id -> TE) overrides routing decisions
    (recorded in the run's config as `whatif.force`, and in each JE's)."""
    if cfg.scheduling.entry == "dispatcher":  # TEs behind the workload stand-in (assembly.py `build_cluster`)
        return run_scenario(dispatcher_scenario(cfg), trace=trace, requests=requests, sink=sink, on_done=on_done,
                            faults=faults, drain_limit_s=drain_limit_s, on_end=on_end)  # fmt: skip
    cfg = for_driver(cfg, "sim")
    config = msgspec.to_builtins(cfg)
    if cfg.scaling == type(cfg.scaling)():  # off and untouched: the run config reads as before [scaling] existed
        del config["scaling"]
    if not cfg.autoscale.enabled:  # off: the run's config as it was before the autoscaler
        config.pop("autoscale", None)
    if cfg.daemon.admin_token:  # a daemon file's secret never reaches the log (its run config)
        config["daemon"]["admin_token"] = REDACTED
    if trace is not None:  # what ran: --trace and --requests override the file's fields
        config["workload"]["trace"] = trace
    if requests is not None:
        config["workload"]["requests"] = requests
    if forced:
        config["whatif"] = {"force": dict(forced)}
    driver = SimDriver(cfg.seed, sink=sink, config=config)
    collector = Collector()
    slo = cfg.slo
    attained = 0
    models = cfg.workload.models or (cfg.cluster.model,)
    by_model = {m: Collector() for m in models} if len(models) > 1 else {}
    model_of: dict[str, str] = {}  # request id -> its model, while it runs (several models only)

    def listen(t: float, env: Any) -> None:
        nonlocal attained
        msg = env.msg
        if type(msg) is Refused:
            msg = refused_done(msg, t)
        elif type(msg) is not RequestDone:
            return
        collector.add(msg)
        if by_model and (m := model_of.pop(msg.request_id, None)) is not None:
            by_model[m].add(msg)
        if msg.status == "completed" and msg.first_token_s is not None:
            ttft_ms = (msg.first_token_s - msg.arrival_s) * 1e3
            tpot_ms = (msg.finish_s - msg.first_token_s) * 1e3 / (msg.output_tokens - 1) if msg.output_tokens > 1 else 0.0
            attained += ttft_ms <= slo.ttft_ms and tpot_ms <= slo.tpot_ms
        if on_done is not None:
            on_done(msg)

    driver.on_external = listen
    recovery: list[tuple[float, str, Any]] = []
    if cfg.faults:  # (a check a delivery: only where there are faults to account for)
        driver.invariants.append(recovery_tap(recovery))
    driver.invariants.extend(taps)
    built = assemble(driver, cfg, stream_to=STREAM_ADDR, forced=forced)
    # The initial deployment (resident TEs) registers at t=0 and its membership reaches every JE
    # before the first arrival, as a daemon is up before its first request.
    driver.run(until=0.0)
    planned = [*faults, *fault_inputs(cfg.faults)]
    for at, dst, fault in planned:
        driver.inject(dst, fault, at=at, src="ext/fault")
    t0 = time.perf_counter()
    if feed is not None:
        injected, last_arrival = feed(driver, built.gateway, model_of if by_model else None)
    else:
        injected, last_arrival = _feed(driver, cfg, built.gateway, trace, requests, model_of if by_model else None)
    drain(driver, collector, injected, last_arrival + drain_limit_s, built.gateway, control_plane_busy)
    if driver.pending():  # timers (heartbeats) never let the heap empty: the run ends here, so
        driver.snapshot_live()  # every actor's final state goes to the log for verify to compare
    if on_end is not None:
        on_end(driver)
    wall = time.perf_counter() - t0
    gw = driver.actor(built.gateway).state
    counters = {k: getattr(gw, k) for k in ("arrived", "completed", "failed", "cancelled", "duplicates", "refused")}
    summary = msgspec.to_builtins(collector.summary())
    end = SimEnd(driver=driver, built=built, cfg=cfg, collector=collector, faults=planned, slo_attained=attained,
                 by_model=by_model, extra_faults=len(faults), recovery_events=recovery)  # fmt: skip
    for report in REPORTERS if reporters is None else reporters:
        report(end, summary)
    return RunResult(summary=summary, deliveries=driver.deliveries, virtual_time_s=driver.now, wall_s=wall,
                     injected=injected, workload=counters)  # fmt: skip


def _feed(driver: SimDriver, cfg: PlatformConfig, gateway: str, trace: str | None, requests: int | None,
          model_of: dict[str, str] | None) -> tuple[int, float]:  # fmt: skip
    """Inject the trace's requests at their times, a window at a time, running the driver up to
    each window's last arrival; (requests injected, the last arrival's time). Requests ask for
    `workload.models` in turn; `model_of` (when given) learns each one's."""
    models = cfg.workload.models or (cfg.cluster.model,)
    injected, last_arrival = 0, 0.0
    pending: tuple[float, Any] | None = None
    feed = arrivals(cfg.scenario(), trace, requests)


    def inject(at: float, a: Any) -> None:
        nonlocal injected, last_arrival
        # stream=False: a simulated client takes its output in one body at the end (HTTP `stream:
        # false`), so a task that failed after producing tokens is retried from scratch
        msg = ApiRequest(request_id=a.request_id, model=models[injected % len(models)], prompt=a.prompt,
                         sampling=a.sampling, reply_to=METRICS_ADDR, stream=False)  # fmt: skip
        driver.inject(gateway, msg, at=at, corr=a.request_id, src="ext/client")
        if model_of is not None:
            model_of[a.request_id] = msg.model
        injected, last_arrival = injected + 1, at

    while True:
        window = 0
        if pending is not None:
            inject(*pending)
            window, pending = 1, None
        for at, a in feed:
            at = max(at, driver.now)  # an already-due arrival (ties with the window's end)
            if window == WINDOW_REQUESTS:
                pending = (at, a)
                break
            inject(at, a)
            window += 1
        if pending is None:
            return injected, last_arrival
        driver.run(until=pending[0])
