"""The whole cluster at a clock time: every TE, its DP groups and every JE, in one view.

`replay state --cluster` (issue 32 §3). Each row is folded from the log exactly as
`replay state --actor` folds one actor (`state_at`): the cluster manager gives each TE's
group, role, generation and lifecycle state; each DP master its queue, running batch and KV
usage; each JE its open jobs. Nothing is re-executed and nothing is guessed: an actor the log
does not hold at that time is shown absent, not zero.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import msgspec

from deepserve.persistence.api import LogReader

from .common import ReplayError, pick_run
from .state import state_at

CLUSTER_MANAGER = "cluster"
_JE = re.compile(r"^je/\d+$")
_MASTER = re.compile(r"^(te/\d+)/dp/(\d+)$")


class DpRow(msgspec.Struct, frozen=True, kw_only=True):
    dp: str  # the DP master's address
    alive: bool
    waiting: int
    running: int
    deferred: int  # PD decode: waiting for room to receive KV
    in_flight_tasks: int  # tasks in the batch on the NPU now (0: idle)
    step: int
    kv_hbm_blocks: int
    kv_hbm_referenced: int  # held by running or waiting requests
    kv_hbm_cached: int  # unreferenced blocks still holding prefix KV
    kv_dram_blocks: int
    kv_dram_used: int
    device_lost: str


class TeRow(msgspec.Struct, frozen=True, kw_only=True):
    te: str
    group: str
    role: str
    model: str
    generation: int
    state: str  # the cluster manager's view: booting, ready, failed, draining, ...
    since_s: float
    source: str  # how its weights arrived (cold, dram-hit, ...)
    reason: str
    dp: tuple[DpRow, ...]
    steps: dict[str, float] = {}  # its boot's steps (DeepServe Table 2 with [scaling] on): name -> seconds
    details: dict[str, str] = {}  # step -> how (pre-warmed pod, npu-fork-roce from te/0, dram-hit, ...)


class JeRow(msgspec.Struct, frozen=True, kw_only=True):
    je: str
    open_jobs: int
    by_phase: dict[str, int]
    queued: int  # jobs waiting for a TE to take them


class ClusterView(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    at: float | None  # None: the end of the log
    tes: tuple[TeRow, ...]
    jes: tuple[JeRow, ...]
    boot: dict[str, Any] = {}  # the booted TEs' per-step means (actors/cluster/prewarm.py `breakdown`)


def cluster_state_at(reader: LogReader, at: float | None = None, run_id: str | None = None) -> ClusterView:
    """Every TE and JE of the run as of clock time `at` (default: the end of the log)."""
    run = pick_run(reader, run_id)
    actors = reader.actors(run.run_id)
    if CLUSTER_MANAGER not in actors:
        raise ReplayError(f"run {run.run_id!r} has no cluster manager ({CLUSTER_MANAGER!r}): it ran TEs "
                          "behind a dispatcher, not the platform; use `replay state --actor A`")  # fmt: skip
    manager = _fold(reader, CLUSTER_MANAGER, at, run.run_id)
    if manager is None:
        raise ReplayError(f"the cluster manager has no record at or before t={at:g}")
    masters: dict[str, list[str]] = {}
    for actor in actors:
        m = _MASTER.match(actor)
        if m:
            masters.setdefault(m.group(1), []).append(actor)
    groups = manager.groups
    tes = []
    for te, rec in sorted(manager.tes.items(), key=lambda kv: _address_key(kv[0])):
        group = groups.get(rec.group)
        dps = tuple(_dp_row(reader, dp, at, run.run_id) for dp in sorted(masters.get(te, []), key=_address_key))
        tes.append(TeRow(te=te, group=rec.group, role=group.role if group else "", model=group.model if group else "",
                         generation=rec.generation, state=rec.state, since_s=rec.since_s, source=rec.source,
                         reason=rec.reason, dp=tuple(d for d in dps if d is not None),
                         steps=dict(rec.steps), details=dict(rec.details)))  # fmt: skip
    jes = [_je_row(reader, je, at, run.run_id) for je in sorted((a for a in actors if _JE.match(a)), key=_address_key)]
    from deepserve.actors.cluster.prewarm import breakdown

    boot = breakdown(manager.tes)
    boot.pop("per_te")
    return ClusterView(run_id=run.run_id, at=at, tes=tuple(tes), jes=tuple(j for j in jes if j is not None),
                       boot=boot if boot["tes"] else {})  # fmt: skip


def _fold(reader: LogReader, actor: str, at: float | None, run_id: str) -> Any:
    """The actor's state at `at`, or None if it had no record by then (born later)."""
    try:
        return state_at(reader, actor, at, run_id).state
    except ReplayError as exc:
        if "has no record at or before" in str(exc):
            return None
        raise


def _dp_row(reader: LogReader, dp: str, at: float | None, run_id: str) -> DpRow | None:
    try:
        st = state_at(reader, dp, at, run_id)
    except ReplayError as exc:
        if "has no record at or before" in str(exc):
            return None
        raise
    m = st.state
    rtc = m.rtc
    hbm = len(rtc.ref)
    referenced = sum(1 for r in rtc.ref if r > 0)
    dram = len(rtc.dram_hash)
    in_flight = len(m.in_flight.entries) if m.in_flight is not None else 0
    return DpRow(dp=dp, alive=st.alive, waiting=len(m.waiting), running=len(m.running), deferred=len(m.deferred),
                 in_flight_tasks=in_flight, step=m.step, kv_hbm_blocks=hbm, kv_hbm_referenced=referenced,
                 kv_hbm_cached=max(0, hbm - len(rtc.free_hbm) - referenced), kv_dram_blocks=dram,
                 kv_dram_used=dram - len(rtc.free_dram), device_lost=m.device_lost)  # fmt: skip


def _je_row(reader: LogReader, je: str, at: float | None, run_id: str) -> JeRow | None:
    state = _fold(reader, je, at, run_id)
    if state is None:
        return None
    jobs = state.jobs.values()
    phases = Counter(j.phase for j in jobs)
    return JeRow(je=je, open_jobs=len(state.jobs), by_phase=dict(sorted(phases.items())),
                 queued=sum(1 for j in jobs if j.queued))  # fmt: skip


def _address_key(address: str) -> tuple[Any, ...]:
    """te/10 after te/9: numeric parts compare as numbers."""
    return tuple(int(p) if p.isdigit() else p for p in address.split("/"))


def cluster_lines(view: ClusterView) -> list[str]:
    """The view as a readable table: a line per DP group under its TE, then the JEs."""
    when = "end of log" if view.at is None else f"t={view.at:g} s"
    lines = [f"cluster at {when} (run {view.run_id}): {len(view.tes)} TEs, {len(view.jes)} JEs", ""]
    head = (f"{'TE':<8} {'role':<10} {'gen':>3} {'state':<10} {'since_s':>8}  {'DP':<12} {'wait':>5} "
            f"{'run':>5} {'batch':>5} {'KV HBM used/cached/total':>26} {'KV DRAM used/total':>19}")  # fmt: skip
    lines.append(head)
    lines.append("-" * len(head))
    for te in view.tes:
        first = f"{te.te:<8} {te.role:<10} {te.generation:>3} {te.state:<10} {te.since_s:>8.2f}"
        if not te.dp:
            lines.append(f"{first}  (no DP group at this time)")
        for i, d in enumerate(te.dp):
            prefix = first if i == 0 else " " * len(first)
            dp = d.dp.removeprefix(te.te + "/") + ("" if d.alive else " stopped")
            hbm = f"{d.kv_hbm_referenced}/{d.kv_hbm_cached}/{d.kv_hbm_blocks}"
            dram = f"{d.kv_dram_used}/{d.kv_dram_blocks}"
            lines.append(f"{prefix}  {dp:<12} {d.waiting:>5} {d.running:>5} {d.in_flight_tasks:>5} {hbm:>26} "
                         f"{dram:>19}" + (f"  device lost: {d.device_lost}" if d.device_lost else ""))  # fmt: skip
        if te.reason:
            lines.append(f"{'':8} reason: {te.reason}")
        if "te_pre_load" in te.steps:  # it booted (not resident): where its boot's time went
            lines.append(f"{'':8} boot: " + ", ".join(
                f"{k} {v:.3f} s" + (f" ({te.details[k]})" if te.details.get(k) else "") for k, v in te.steps.items()))  # fmt: skip
    if view.boot:
        means = ", ".join(f"{k} {v:.3f}" for k, v in view.boot["step_means_s"].items())
        lines += ["", f"boot steps, mean over {view.boot['tes']} TEs booted (s): {means}; "
                      f"TE-Load: {', '.join(f'{k} {v}' for k, v in view.boot['te_load_paths'].items())}"]  # fmt: skip
    lines.append("")
    for je in view.jes:
        phases = ", ".join(f"{k} {v}" for k, v in je.by_phase.items()) or "none"
        lines.append(f"{je.je}: {je.open_jobs} open jobs ({phases}); {je.queued} queued for a TE")
    return lines
