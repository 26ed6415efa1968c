"""A what-if of a recorded run (issue 32 §1, §2): its external inputs (replay/inputs.py) played on
the whole cluster in virtual time — `sim.run`, what `deepserve sim` runs — under a changed config,
or with one routing decision forced to another TE; beside it, the original run's summary, with
the keys of `sim --json`, computed from its log by the same reporters.

The original column reads the log, never re-runs it: for a simulation it equals the run's own
summary (the terminal records and events are the run's), for a daemon it is what the wall-clock
run recorded. The what-if injects the recorded requests in the simulation's own windows (sim.py
`_feed`: `WINDOW_REQUESTS` at a time, the driver run up to the next window's first arrival), so
a what-if of a simulation with nothing changed is that run again, record for record (same digest).

The config is the log's (its run record's resolved config) or `--config`'s, with `--set`s on top.
A simulation's `[[faults]]` are the config's (a what-if may move one); a daemon never injects
its config's faults (`deepserve fault` does, recorded as `ext/admin`), so a daemon's what-if
drops them and replays its recorded admin inputs. A daemon's run seed is `daemon.seed`.
`workload.*` is refused: a what-if replays the recorded requests, not a trace.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import msgspec

from deepserve.actors.gateway.messages import Refused
from deepserve.actors.workload.metrics import Collector
from deepserve.adapters.scenario.loader import ScenarioError, apply_override, parse_override
from deepserve.core import SimDriver
from deepserve.core.records import LogSink
from deepserve.replay.common import ReplayError
from deepserve.replay.decisions import (
    DECISION_TYPES,
    ROUTING_TYPES,
    Comparer,
    FirstDifference,
    decision_of,
    decoded,
)
from deepserve.replay.inputs import RunInputs

from .assembly import MANAGER_ADDR, Built
from .config import Invalid, load_doc, validated
from .layout import plan
from .run import WINDOW_REQUESTS, RunResult
from .schema import PlatformConfig
from .sim import REPORTERS, SimEnd, refused_done, run


class WhatIf(msgspec.Struct, kw_only=True):  # (Agreement below: a forward reference msgspec resolves)
    original: RunResult
    whatif: RunResult
    first_difference: FirstDifference | None
    changes: list[str]  # what was changed, as given (`--set`s, `--config`, the forced decision)
    request: dict[str, Any] | None = None  # a forked decision's request: {"original": ..., "whatif": ...}
    agreement: Agreement | None = None  # a daemon run: how far its virtual re-run (no change) agrees


class Agreement(msgspec.Struct, kw_only=True):
    """How far a daemon's wall-clock run and its virtual re-run with nothing changed agree: the
    same TE chosen for the same task, the same end for the same request (the emulated timings
    are one model; the wall clock adds the machine's own delays, which move load and so choices)."""

    routing_decisions: int  # the original's
    same_te: int  # of which the re-run routed the same task to the same TE
    requests: int  # the original's terminal requests
    same_end: int  # of which the re-run ended the same way (status)
    rerun: RunResult | None = None  # the re-run's own summary (None: the what-if itself changed nothing)


def config_of(inputs: RunInputs, config: str | None, overrides: Sequence[str]) -> PlatformConfig:
    """The what-if's config (module docstring); a bad key or value is a `ScenarioError` naming it."""
    for o in overrides:
        key, _ = parse_override(o)
        if key == "workload" or key.startswith("workload."):
            raise ScenarioError(f"--set {o}", key, "a what-if replays the run's recorded requests: the "
                                "workload is not a setting it can change")  # fmt: skip
    daemon = inputs.mode != "sim"
    if config is not None:
        doc, labels, source = load_doc(config, [], "up" if daemon else "sim")
    else:
        # a deep copy: `--set` writes into the document's tables, which are the recorded config's
        doc = copy.deepcopy({k: v for k, v in inputs.config.items() if k != "whatif"})
        labels, source = {}, f"{inputs.path} (the run's config)"
    doc["workload"] = copy.deepcopy(inputs.config.get("workload", doc.get("workload", {})))
    if daemon:
        doc["faults"] = []
        doc["seed"] = inputs.config.get("daemon", {}).get("seed", 0)
    for o in overrides:
        key, value = parse_override(o)
        apply_override(doc, key, value, f"--set {o}")
        labels[key] = f"--set {o}"
    try:
        return validated(doc)
    except Invalid as bad:
        label = next((v for k, v in labels.items() if k == bad.key or bad.key.startswith(k + ".")), source)
        raise ScenarioError(label, bad.key, bad.problem) from None


def original(inputs: RunInputs, cfg: PlatformConfig, manager_state: Any) -> RunResult:
    """The recorded run's summary, from its log, by `sim.run`'s reporters (module docstring)."""
    c = Collector()
    slo, attained = cfg.slo, 0
    for t, msg in inputs.terminal:
        if type(msg) is Refused:
            msg = refused_done(msg, t + inputs.t0)
        c.add(msg)
        if msg.status == "completed" and msg.first_token_s is not None:
            ttft_ms = (msg.first_token_s - msg.arrival_s) * 1e3
            tpot_ms = (msg.finish_s - msg.first_token_s) * 1e3 / (msg.output_tokens - 1) if msg.output_tokens > 1 else 0.0
            attained += ttft_ms <= slo.ttft_ms and tpot_ms <= slo.tpot_ms
    models = cfg.workload.models or (cfg.cluster.model,)
    by_model = {m: Collector() for m in models} if len(models) > 1 else {}
    if by_model:
        model_of = {i.msg.request_id: i.msg.model for i in inputs.requests}
        for _t, msg in inputs.terminal:
            m = model_of.get(msg.request_id)
            if m in by_model:
                by_model[m].add(msg if type(msg) is not Refused else refused_done(msg, _t + inputs.t0))
    cell = SimpleNamespace(actor=SimpleNamespace(state=manager_state))
    driver = SimpleNamespace(cells={MANAGER_ADDR: cell} if manager_state is not None else {}, now=inputs.end_t)
    layout = plan(cfg)
    faults = admin_faults(inputs)
    end = SimEnd(driver=driver, built=Built(layout, "", (), cfg.control.heartbeats), cfg=cfg, collector=c,
                 faults=faults, extra_faults=len(faults), recovery_events=inputs.recovery_events,
                 slo_attained=attained, by_model=by_model)  # fmt: skip
    summary = msgspec.to_builtins(c.summary())
    for report in REPORTERS:
        report(end, summary)
    targets = [decoded(p).about for p in inputs.decisions.get(MANAGER_ADDR, ()) if p.kind == "GroupTarget"]
    summary["scaling_actions"] = len(targets) - len(set(targets))  # each group's first: the deployment
    return RunResult(summary=summary, deliveries=inputs.deliveries, virtual_time_s=inputs.end_t, wall_s=0.0,
                     injected=len(inputs.requests), workload={})  # fmt: skip


def admin_faults(inputs: RunInputs) -> list[tuple[float, str, Any]]:
    """A daemon's `deepserve fault` inputs (to a pod, a device, a link); its `scale` commands go
    to the cluster manager and are no fault."""
    return [(i.t, i.actor, i.msg) for i in inputs.others if i.src == "ext/admin" and i.actor != MANAGER_ADDR]


def _feeder(inputs: RunInputs) -> Any:
    """Inject the recorded requests as `sim._feed` injects a trace's, window by window; the other
    client inputs (cancels) go in at their times with the window they fall in."""
    reqs = inputs.requests
    # cancels, and an admin's commands to the cluster manager (`deepserve scale`): not faults
    cancels = [i for i in inputs.others if i.src not in ("ext/fault", "ext/admin") or i.actor == MANAGER_ADDR]

    def feed(driver: SimDriver, gateway: str, model_of: dict[str, str] | None) -> tuple[int, float]:
        for i in cancels:
            driver.inject(i.actor, i.msg, at=i.t, corr=i.corr, src=i.src)
        last = 0.0
        for start in range(0, len(reqs), WINDOW_REQUESTS):
            if start:
                driver.run(until=max(reqs[start].t, driver.now))
            for i in reqs[start:start + WINDOW_REQUESTS]:
                at = max(i.t, driver.now)
                driver.inject(gateway, i.msg, at=at, corr=i.corr, src=i.src)
                if model_of is not None:
                    model_of[i.msg.request_id] = i.msg.model
                last = at
        if inputs.mode != "sim" and inputs.others:  # a daemon's last admin action may come after its last request
            driver.run(until=max(driver.now, max(i.t for i in inputs.others)))
        return len(reqs), last

    return feed


def scaling_tap(into: list[int], seen: set[str] | None = None) -> Any:
    """Counts the cluster manager's group target changes after each group's first (scaling actions:
    an admin's `scale`, an autoscaler's); `seen`: the groups that had their first already."""

    seen = set() if seen is None else seen

    def tap(driver: SimDriver) -> None:
        cell = driver.step_cell
        if cell.addr == MANAGER_ADDR:
            for ev in cell.ctx.events:
                if type(ev).__name__ == "GroupTarget":
                    into[0] += ev.group in seen  # each group's first: the deployment
                    seen.add(ev.group)

    return tap


def decision_tap(comparer: Comparer) -> Any:
    """A per-delivery checker handing each decision the delivery recorded to `comparer`."""

    def tap(driver: SimDriver) -> None:
        cell = driver.step_cell
        for k, ev in enumerate(cell.ctx.events):
            kind = type(ev).__name__
            if kind in DECISION_TYPES:
                comparer.add(decision_of(cell.addr, cell.seq, k, driver.now, kind, ev))
        if comparer.done:  # the runs have parted: nothing later is compared (decisions.py)
            driver.invariants.remove(tap)

    return tap


def whatif(inputs: RunInputs, cfg: PlatformConfig, manager_state: Any, *, changes: list[str],
           sink: LogSink | None = None, forced: dict[str, str] | None = None,
           from_s: float | None = None) -> WhatIf:  # fmt: skip
    """The original and the what-if side by side, and where their decisions first part. With
    `from_s`, forked at that time (cluster/whatif_fork.py): `inputs` read with that prefix."""
    before = original(inputs, cfg, manager_state)
    comparer = Comparer(inputs.decisions)
    admin = admin_faults(inputs)
    t0 = time.perf_counter()
    if from_s is not None:
        return _forked(inputs, cfg, before, comparer, admin, from_s, changes, t0)
    rid = next(iter(forced)).partition("/")[0] if forced else None
    seen: dict[str, Any] = {}

    def on_done(msg: Any) -> None:
        if msg.request_id == rid:
            seen["whatif"] = outcome(msg)

    scaled = [0]
    after = run(cfg, sink=sink, feed=_feeder(inputs), faults=admin, taps=[decision_tap(comparer), scaling_tap(scaled)],
                forced=forced, on_done=on_done if rid else None)  # fmt: skip
    after.wall_s = time.perf_counter() - t0
    after.summary["scaling_actions"] = scaled[0]
    if rid is not None:
        done = [m for _t, m in inputs.terminal if m.request_id == rid]
        seen["original"] = outcome(done[0]) if done and type(done[0]) is not Refused else None
        seen.setdefault("whatif", None)
        seen["request_id"] = rid
    return WhatIf(original=before, whatif=after, first_difference=comparer.first(), changes=changes,
                  request=seen or None)  # fmt: skip


def outcome(m: Any) -> dict[str, Any]:
    """A request's end, as the side-by-side shows it."""
    ttft = (m.first_token_s - m.arrival_s) * 1e3 if m.first_token_s is not None else None
    return {"status": m.status, "reason": m.reason, "te": m.te, "ttft_ms": ttft,
            "e2e_ms": (m.finish_s - m.arrival_s) * 1e3, "cached_prompt_tokens": m.cached_prompt_tokens}


def routing_decision(inputs: RunInputs, decision_id: str, te: str) -> dict[str, str]:
    """`--at-decision ID --choose TE` as the JEs' forced choice; a bad id or TE is a ReplayError."""
    routed = [p for ps in inputs.decisions.values() for p in ps if p.kind in ROUTING_TYPES]
    key = decision_id.encode()  # (decoded only where the id's bytes are: a whole trace has 10^4 decisions)
    found = [d for d in (decoded(p) for p in routed if key in p.payload) if d.id == decision_id]
    if not found:
        some = [d.id for d in (decoded(p) for p in routed[:5])]
        raise ReplayError(f"--at-decision {decision_id}: no routing decision with this id in run {inputs.run_id!r} "
                          f"(ids are task ids, as `replay why` shows them, e.g. {', '.join(some) or 'none recorded'})")  # fmt: skip
    d = found[0]
    if te == d.choice:
        raise ReplayError(f"--choose {te}: decision {decision_id} chose {te} already; choose another of "
                          f"{', '.join(c for c in d.candidates if c != te) or '(no other candidate)'}")  # fmt: skip
    if te not in d.candidates:
        raise ReplayError(f"--choose {te}: not a candidate of decision {decision_id} "
                          f"(candidates: {', '.join(d.candidates) or 'none'})")  # fmt: skip
    return {decision_id: te}


def agreement(inputs: RunInputs, cfg: PlatformConfig, same: WhatIf | None = None) -> Agreement:
    """The daemon run against its virtual re-run with no change (`cfg`: the recorded config as
    `config_of` makes it); `same`: a what-if that changed nothing already ran (its numbers are the
    re-run's, but its decisions were compared only up to the first difference: re-run anyway)."""
    chosen: dict[str, str] = {}
    ends: dict[str, str] = {}

    def tap(driver: SimDriver) -> None:
        for ev in driver.step_cell.ctx.events:
            if type(ev).__name__ == "RouteDecided":
                chosen[ev.task_id] = ev.decision.chosen

    admin = admin_faults(inputs)
    rerun = run(cfg, feed=_feeder(inputs), faults=admin, taps=[tap],
                on_done=lambda m: ends.__setitem__(m.request_id, m.status))  # fmt: skip
    mine = [decoded(p) for ps in inputs.decisions.values() for p in ps if p.kind in ROUTING_TYPES]
    theirs = {m.request_id: m.status if type(m) is not Refused else "failed" for _t, m in inputs.terminal}
    return Agreement(routing_decisions=len(mine), same_te=sum(chosen.get(d.id) == d.choice for d in mine),
                     requests=len(theirs), same_end=sum(ends.get(r) == st for r, st in theirs.items()),
                     rerun=None if same is not None else rerun)  # fmt: skip


def _forked(inputs: RunInputs, cfg: PlatformConfig, before: RunResult, comparer: Comparer,
            admin: list[tuple[float, str, Any]], from_s: float, changes: list[str], t0: float) -> WhatIf:  # fmt: skip
    """Forked at `from_s`: the driver restored from the log at that time (cluster/whatif_restore.py),
    or, where the log cannot say everything the driver held (replay/fork.py), the recorded
    config's run up to `from_s`, checked against the log, then `cfg`'s (cluster/whatif_fork.py)."""
    from .whatif_fork import changed_actors

    base = config_of(inputs, None, [])
    changed = changed_actors(base, cfg)
    if inputs.cut is not None:
        from .whatif_restore import restored_run

        forked: list[str] = []
        before_t = {a: [p for p in ps if p.t <= from_s] for a, ps in inputs.decisions.items()}
        comparer.pos = {a: len(ps) for a, ps in before_t.items() if ps}
        targets = [decoded(p).about for p in before_t.get(MANAGER_ADDR, ()) if p.kind == "GroupTarget"]
        scaled, seen = [len(targets) - len(set(targets))], set(targets)
        try:
            after = restored_run(inputs, base, cfg, inputs.cut, admin, [decision_tap(comparer), scaling_tap(scaled, seen)],
                                 changed, forked)  # fmt: skip
        except ReplayError as why:
            fallback = f"{why}; re-ran the prefix instead"
        else:
            after.wall_s = time.perf_counter() - t0
            after.summary["scaling_actions"] = scaled[0]
            return WhatIf(original=before, whatif=after, first_difference=comparer.first(),
                          changes=[*changes, f"--from {from_s:g}: restored from the log at t={from_s:g} "
                                   f"({inputs.cut.delivered} deliveries before it not re-run); rebuilt with the "
                                   f"change: {', '.join(forked) or 'no actor'}"])  # fmt: skip
        comparer = Comparer(inputs.decisions)
        from deepserve.replay.inputs import open_run

        inputs.prefix = open_run(inputs.path, inputs.run_id, from_s).prefix  # (a cut keeps no hash)
    else:
        fallback = "re-ran the prefix"
    return _rerun_prefix(inputs, base, cfg, before, comparer, admin, from_s, [*changes, fallback], t0, changed)


def _rerun_prefix(inputs: RunInputs, base: PlatformConfig, cfg: PlatformConfig, before: RunResult,
                  comparer: Comparer, admin: list[tuple[float, str, Any]], from_s: float, changes: list[str],
                  t0: float, changed: dict[str, Any]) -> WhatIf:  # fmt: skip
    """The recorded config's run up to `from_s`, checked against the log, then `cfg`'s."""
    from .whatif_fork import PrefixHash, fork_tap

    assert inputs.prefix is not None, "read the inputs with the prefix (open_run's prefix_until_s)"
    hashed = PrefixHash(from_s)
    forked: list[str] = []
    tap = fork_tap(from_s, changed, forked)
    scaled = [0]
    after = run(base, sink=hashed, feed=_feeder(inputs), faults=admin,  # type: ignore[arg-type]
                taps=[tap, decision_tap(comparer), scaling_tap(scaled)])  # fmt: skip
    after.wall_s = time.perf_counter() - t0
    after.summary["scaling_actions"] = scaled[0]
    want, steps = inputs.prefix
    if (hashed.h.hexdigest(), hashed.steps) != (want, steps):
        raise ReplayError(f"--from {from_s:g}: the re-run up to t={from_s:g} is not the log's ({hashed.steps} "
                          f"steps re-run, {steps} logged, different content): it cannot be forked there")  # fmt: skip
    return WhatIf(original=before, whatif=after, first_difference=comparer.first(),
                  changes=[*changes, f"--from {from_s:g}: the {steps} steps up to it re-run and checked against "
                           f"the log; rebuilt with the change: {', '.join(forked) or 'no actor'}"])  # fmt: skip
