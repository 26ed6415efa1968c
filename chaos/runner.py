"""One chaos seed, start to end: the platform built, warmed up until every TE group is ready, the
seed's faults injected, the trace run through `run_scenario` with the checkers after every step,
then the settle time (faults stopped: the cluster must converge), the end checks and the replay.

A seed is a pure function of (scenario, seed, requests): its result — requests, faults,
violations with their steps — is the same wherever it runs (a local process or a Ray worker).
Its log is written to `log_dir`; kept when the seed failed (or `keep_log`), else deleted.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import msgspec

from deepserve.cluster.control import MANAGER_ADDR
from deepserve.cluster.run import arrivals, run_scenario
from deepserve.cluster.schema import PlatformConfig
from deepserve.core import SimDriver

from . import schedule
from .invariants import Checker, Violation
from .platform import build_platform, chaos_config, settle_s

WARMUP_LIMIT_S = 120.0  # virtual time for the first TEs to boot (a 16 GB model from SSD: ~10 s)
CHECK_EVERY_S = 0.5


class SeedResult(msgspec.Struct, frozen=True, kw_only=True):
    seed: int
    requests: int  # accepted (injected) requests
    completed: int
    failed: int
    faults_injected: int
    faults: tuple[str, ...]  # the schedule, readable
    violations: int  # every violation seen (the first `MAX_KEPT` are listed)
    first: Violation | None
    listed: tuple[Violation, ...]
    steps: int
    virtual_s: float
    wall_s: float
    log: str  # "" when dropped
    late_chunks: int = 0
    tokens_streamed: int = 0  # tokens the token checker followed (streaming clients)
    failed_reasons: dict[str, int] = {}  # failed requests by reason (its first 100 characters)
    taken_over: int = 0  # streams another task took over mid-way (migrated, retried), checked


def log_path(log_dir: str, name: str, seed: int) -> str:
    return os.path.join(log_dir, f"chaos-{name}-{seed}.db")


def run_seed(config: PlatformConfig, seed: int, requests: int | None, log_dir: str, keep_log: bool = False) -> SeedResult:
    """Run one seed and check it (see the module's docstring)."""
    from deepserve.persistence import open_sink

    cfg = chaos_config(config, seed, requests)
    sc = cfg.scenario()
    path = log_path(log_dir, cfg.name, seed)
    _remove(path)  # a previous run of this seed: replaced
    checker = Checker()
    feed = [(at, msg.request_id) for at, msg in arrivals(sc, None, None) if msg is not None]
    checker.accepted = {rid for _, rid in feed}
    # faults over the traffic: the window spans the arrivals (at least WINDOW_S)
    window_s = max(schedule.WINDOW_S, max((at for at, _ in feed), default=0.0))
    faults: tuple[schedule.FaultSpec, ...] = ()
    injected, start = 0, 0.0

    groups: dict[str, int] = {}

    def build(driver: SimDriver, _s: Any) -> Any:
        nonlocal faults, injected, start
        built = build_platform(driver, cfg)
        groups.update(built.layout.groups)
        checker.attach(driver)
        start = warm_up(driver, groups)
        targets = schedule.targets_of(cfg.cluster.topology, built.layout.placement, built.jes)
        faults = schedule.draw(seed, targets, window_s)
        for at, dst, msg in schedule.injections(faults, start, built.gateway):
            driver.inject(dst, msg, at=at, src="ext/fault")
            injected += 1
        return built.layout.placement

    def settle(driver: SimDriver) -> None:
        driver.run(until=max(driver.now, start + window_s + settle_s(cfg)))
        checker.at_end(driver, groups, MANAGER_ADDR)
        # heartbeats keep the heap from emptying, which is when the driver logs every actor's
        # final state: logged here, so the replay compares final states too
        driver.snapshot_live()

    t0 = time.perf_counter()
    sink = open_sink(path)
    try:
        result = run_scenario(sc, build=build, sink=sink, on_end=settle, on_done=None,
                              config_note={"platform": msgspec.to_builtins(cfg)})
    finally:
        sink.close()
    check_replay(path, checker, result.virtual_time_s)
    failed = checker.count > 0
    if not (failed or keep_log):
        _remove(path)
    w = result.workload
    return SeedResult(
        seed=seed, requests=result.injected, completed=w["completed"], failed=w["failed"],
        faults_injected=injected, faults=tuple(schedule.describe(f) for f in faults),
        violations=checker.count, first=checker.violations[0] if checker.violations else None,
        listed=tuple(checker.violations), steps=checker.step, virtual_s=round(result.virtual_time_s, 3),
        wall_s=round(time.perf_counter() - t0, 3), log=path if failed or keep_log else "",
        late_chunks=checker.late_chunks, tokens_streamed=sum(checker.streamed.values()),
        taken_over=len(checker.taken_over),
        failed_reasons=dict(Counter(d.reason[:100] for d in checker.done.values() if d.status == "failed")),
    )  # fmt: skip


def warm_up(driver: SimDriver, groups: dict[str, int], limit_s: float = WARMUP_LIMIT_S) -> float:
    """Run until every TE group has its target of ready TEs (the daemon serves from then on);
    returns that time. Arrivals due before it are injected at it (run.py: `max(at, now)`)."""
    while driver.now < limit_s:
        cell = driver.cells.get(MANAGER_ADDR)
        cm = cell.actor.state if cell is not None and cell.actor is not None else None
        if cm is not None and all(
            sum(r.group == g and r.state == "ready" for r in cm.tes.values()) >= n for g, n in groups.items()
        ):
            break
        driver.run(until=driver.now + CHECK_EVERY_S)
    return driver.now


def check_replay(path: str, checker: Checker, end_s: float) -> None:
    """The `replay` invariant: the seed's log re-executes identically (replay.verify)."""
    from deepserve.persistence import open_log
    from deepserve.replay import verify

    reader = open_log(path)
    try:
        v = verify(reader)
    finally:
        reader.close()
    if not v.identical:
        d = v.divergence
        where = f"{d.actor} seq {d.seq} ({d.what})" if d is not None else "the log's end"
        checker.report("replay", d.t if d is not None else end_s, d.actor if d is not None else "",
                       f"the log does not replay identically: first divergence at {where}", step=v.inputs)
    elif not v.ended:  # a final state not compared is not proven
        checker.report("replay", end_s, "", "the log ends before the actors' final states", step=v.inputs)


def _remove(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
