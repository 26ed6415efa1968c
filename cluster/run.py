"""Run a scenario behind the dispatcher (assembly.py `build_cluster`): build the cluster in a
SimDriver, feed the trace in, collect the metrics. `arrivals` is also the platform run's feed
(sim.py).

Arrivals are external inputs injected at their trace times (`Arrive` to the workload actor), read
from the trace as the run goes (streaming: a whole trace is never in memory). They are injected in
windows of `WINDOW_REQUESTS`: SimDriver counts not-yet-due injected inputs against the receiver's
mailbox capacity (kernel-core fixes that on its branch), so a whole trace injected at once would
fill the workload actor's mailbox and bounce the TEs' answers. A window also keeps the heap small.

The run ends when every injected request is terminal. Actors with periodic timers (load reports)
keep the heap non-empty forever, so the loop watches the count, not the heap; if the cluster stops
making progress (`drain_limit_s` of virtual time after the last arrival), `EndOfRun` fails what is
left, recorded — nothing accepted ends unrecorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgspec

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.tokens import combine
from deepserve.actors.workload.messages import Arrive, EndOfRun, RequestDone
from deepserve.actors.workload.metrics import Collector
from deepserve.adapters.scenario.faults import fault_inputs
from deepserve.adapters.scenario.loader import trace_path
from deepserve.adapters.scenario.schema import Scenario
from deepserve.adapters.traces import TraceError, TraceRequest, open_trace
from deepserve.adapters.traces.prompts import prompts_of
from deepserve.core import Message, SimDriver
from deepserve.core.records import LogSink

from .assembly import WORKLOAD_ADDR, build_cluster
from .te import max_prompt_tokens

WINDOW_REQUESTS = 512
DRAIN_CHUNK = 20_000  # deliveries between progress checks while draining
PROMPT_CHUNK = 1024  # trace rows read, and their prompts hashed, together (chains.py)


class RunResult(msgspec.Struct, kw_only=True):
    summary: dict[str, Any]
    deliveries: int
    virtual_time_s: float
    wall_s: float
    injected: int
    workload: dict[str, int]  # the workload actor's counters (arrived, completed, ...)


def arrivals(
    scenario: Scenario, trace: str | None, requests: int | None,
    select: Callable[[int], bool] | None = None,
) -> Iterator[tuple[float, Arrive | None]]:  # fmt: skip
    """(time, Arrive) for each request of the trace, scaled by `rps_scale`, first `requests`.
    With `select` (a partition's filter on the request's 0-based position), a request it does
    not select comes as (time, None): it still counts towards the injection windows, so that
    every partition injects at the same points of the trace as the whole run does. Rows are
    read `PROMPT_CHUNK` at a time, their prompts hashed together (`prompts_of`); a bad row
    raises after the rows before it are yielded, as when they were read one by one. A prompt
    no TE of the cluster can take is a bad row (it would fail on every TE it was offered)."""
    w, c = scenario.workload, scenario.cluster
    limit = requests if requests is not None else (w.requests or None)
    source = open_trace(trace_path(trace or w.trace))
    rows = iter(source.head(limit))
    longest, why = max_prompt_tokens(c)
    field = "input_length" if source.format == "mooncake" else "ContextTokens"
    position = 0
    while True:
        chunk: list[TraceRequest] = []
        error: Exception | None = None
        try:
            for req in rows:
                if req.prompt_tokens > longest:
                    raise TraceError(source.path, req.line, field,
                                     f"{req.prompt_tokens} tokens exceed the {longest} a TE of this "
                                     f"cluster can take ({why})")  # fmt: skip
                chunk.append(req)
                if len(chunk) == PROMPT_CHUNK:
                    break
        except Exception as exc:  # noqa: BLE001 - re-raised once the rows before it are out
            error = exc
        keep = [select is None or select(position + i) for i in range(len(chunk))]
        chosen = [_cache_view(req, c.prefix_caching) for req, k in zip(chunk, keep, strict=True) if k]
        prompts = iter(prompts_of(chosen, c.kv_block_tokens))
        it = iter(chosen)
        for req, k in zip(chunk, keep, strict=True):
            at = req.arrival_s / w.rps_scale
            if not k:
                yield at, None
                continue
            req = next(it)
            seed = combine(scenario.seed & ((1 << 64) - 1), req.index)
            out = min(req.output_tokens, w.max_tokens)
            yield at, Arrive(
                request_id=f"r{req.index}", model=c.model, prompt=next(prompts),
                sampling=Sampling(max_tokens=out, target_output_tokens=out, seed=seed, ignore_eos=True),
            )  # fmt: skip
        position += len(chunk)
        if error is not None:
            raise error
        if len(chunk) < PROMPT_CHUNK:
            return


def _cache_view(req: TraceRequest, prefix_caching: bool) -> TraceRequest:
    if not prefix_caching and req.hash_ids is not None:
        # Prefix caching off: every prompt gets a chain of its own, so no prefix can match
        # (what vLLM's enable_prefix_caching=False means to the scheduler).
        return msgspec.structs.replace(req, hash_ids=None)
    return req


def run_scenario(
    scenario: Scenario,
    *,
    build: Callable[[SimDriver, Scenario], Any] | None = None,
    trace: str | None = None,
    requests: int | None = None,
    sink: LogSink | None = None,
    on_done: Callable[[RequestDone], None] | None = None,
    on_window: Callable[[SimDriver], None] | None = None,
    on_end: Callable[[SimDriver], None] | None = None,
    faults: Sequence[tuple[float, str, Message]] = (),
    drain_limit_s: float = 24 * 3600.0,
    select: Callable[[int], bool] | None = None,
    config_note: dict[str, Any] | None = None,
) -> RunResult:
    """Run `scenario` to completion and return its metrics. `sink` is not closed. `on_window`
    sees the driver between arrival windows (tests sample load there), `on_end` at the end;
    `faults` are (time, address, message) external inputs, e.g. a corrupted KV block; `select`
    keeps the requests (by 0-based position in the trace) a partition runs (parallel.py), and
    `config_note` is added to the run's recorded config (which partition this log is)."""
    config = msgspec.to_builtins(scenario)
    if not config.get("autoscale"):  # no [autoscale] table: the run's config as it was before it
        config.pop("autoscale", None)
    # What ran: --trace and --requests override the scenario's fields (the run record said the
    # scenario's own trace and request count before)
    if trace is not None:
        config["workload"]["trace"] = trace
    if requests is not None:
        config["workload"]["requests"] = requests
    if config_note:
        config.update(config_note)
    driver = SimDriver(scenario.seed, sink=sink, config=config)
    collector = Collector()

    def listen(_t: float, env: Any) -> None:
        if type(env.msg) is RequestDone:
            collector.add(env.msg)
            if on_done is not None:
                on_done(env.msg)

    driver.on_external = listen
    placed = (build or build_cluster)(driver, scenario)
    # a split run (`select`) holds its servers' NPUs and links alone: their faults only
    own = tuple(sorted({te.server for te in placed.tes})) if select is not None and placed is not None else None
    for at, dst, fault in (*faults, *fault_inputs(scenario.faults, own)):
        driver.inject(dst, fault, at=at, src="ext/fault")
    t0 = time.perf_counter()
    injected = 0
    last_arrival = 0.0
    pending: tuple[float, Arrive | None] | None = None
    feed = arrivals(scenario, trace, requests, select)
    while True:
        window = 0
        if pending is not None:
            at, msg = pending
            if msg is not None:
                driver.inject(WORKLOAD_ADDR, msg, at=at, corr=msg.request_id, src="ext/client")
                injected += 1
            window, pending = 1, None
        for at, msg in feed:
            at = max(at, driver.now)  # an already-due arrival (ties with the window's end)
            if window == WINDOW_REQUESTS:
                pending = (at, msg)
                break
            if msg is not None:
                driver.inject(WORKLOAD_ADDR, msg, at=at, corr=msg.request_id, src="ext/client")
                injected, last_arrival = injected + 1, at
            window += 1
        if pending is None:
            break
        driver.run(until=pending[0])
        if on_window is not None:
            on_window(driver)
    drain(driver, collector, injected, last_arrival + drain_limit_s, WORKLOAD_ADDR)
    if on_end is not None:
        on_end(driver)
    wall = time.perf_counter() - t0
    state = driver.actor(WORKLOAD_ADDR).state
    counters = {k: getattr(state, k) for k in ("arrived", "completed", "failed", "cancelled", "duplicates")}
    return RunResult(
        summary=msgspec.to_builtins(collector.summary()), deliveries=driver.deliveries,
        virtual_time_s=driver.now, wall_s=wall, injected=injected, workload=counters,
    )  # fmt: skip


def drain(driver: SimDriver, collector: Collector, injected: int, deadline_s: float, entry: str,
          busy: Callable[[SimDriver], bool] | None = None) -> None:  # fmt: skip
    """Deliver until every injected request is terminal, or give up at `deadline_s`: then
    `EndOfRun` to `entry` (the workload stand-in, or the gateway) fails what is left, recorded.

    The run ends when the platform is idle: at the instant the last request became terminal
    (the delivery that made it so ends the chunk in progress, `run_chunk`; what else is due at
    that instant is delivered), or, while `busy` says the control plane is still at work then
    (a TE starting, being replaced or drained), at the instant it stops being so. The timers
    that never run out (heartbeats, load reports) are not run on past that: before, the last
    chunk went on, and the run's virtual time depended on the chunk sizes (the whole Mooncake
    trace: 3,781 s, its last request ended at 3,571 s)."""
    if not injected:  # (a partition given no request): the cluster still starts, recorded
        driver.run(until=driver.now)
        return
    while collector.terminal < injected:
        if not driver.pending() or driver.now >= deadline_s:
            driver.inject(entry, EndOfRun(), src="ext/operator")
            driver.run(until=driver.now)  # everything due now, the EndOfRun included
            return
        # No `until`: SimDriver.run(until=T) moves the clock to T when the heap empties. Chunks
        # shrink with the requests left, so the deadline is checked often near the end.
        run_chunk(driver, all_terminal(collector, injected), min(DRAIN_CHUNK, 64 + 16 * (injected - collector.terminal)))
    driver.run(until=driver.now)  # the rest of the last request's instant
    settling = busy if busy is not None else (lambda _d: False)
    while settling(driver) and driver.pending() and driver.now < deadline_s:
        run_chunk(driver, lambda d: not settling(d), DRAIN_CHUNK)
        driver.run(until=driver.now)


def all_terminal(collector: Collector, injected: int) -> Callable[[SimDriver], bool]:
    """`run_chunk`'s `done` for the requests: all `injected` are terminal."""
    return lambda _d: collector.terminal >= injected


def run_chunk(driver: SimDriver, done: Callable[[SimDriver], bool], max_deliveries: int) -> None:
    """`driver.run(max_deliveries=...)`, ended early by the delivery after which `done` holds
    (a checker that sets `halt`, for this call only)."""

    def check(d: SimDriver) -> None:
        if done(d):
            d.halt = True

    driver.invariants.append(check)
    try:
        driver.run(max_deliveries=max_deliveries)
    finally:
        driver.invariants.remove(check)
