"""`deepserve bench recovery` (issue 33 §3): one fault on the same workload, same seed, under each
rung of the recovery ladder that applies to it — detection time, recovery time, the requests it
touched and how they ended, the tokens generated again.

The cluster is a small P/D pool (xDeepServe §6.2 stage 1's kind: `PREFILL` prefill and `DECODE`
decode Llama-3-8B TEs on 910B over RoCE, one spare server), serving the first `requests` of the
built-in Azure conversation trace (one body a request; `stream`: streamed). Each fault hits the
first decode TE (`te/{PREFILL}`: its NPU, its RoCE NIC, or its process) at `FAULT_AT_S`, while
it decodes. Rungs: the cluster manager's ladder (`RUNGS`: replace, restart-world, pd-separate,
substitute) and, each on the baseline plus one setting (`SETTINGS`), the JE's request migration
(streamed requests only), the engine's token recomputation and HBM masking, KV link probing.

Columns (every number read off the run's recorded events and its client-side outputs):
- `detected_s`: fault → the TE declared failed, else the engine's own handling (a pass rolled
  back, an HBM part masked) or a probed link's verdict (None: nothing noticed it; `diagnosis`);
- `recovered_s`: fault → every TE the rung relaunched is ready again (None: nothing relaunched),
  before a tainted node's repair (`recovery.node_repair_s`) brings back what the rung took down;
- `whole_s`: fault → all the cluster's TEs ready again (after that repair, when one was needed);
- `serving_min`: the fewest TEs ready at once from the fault on (the capacity dip);
- `affected`: requests with a task ended failed (or migrated) after the fault, any TE;
- `failed`: of those, requests that ended failed; `migrated`: requests moved to another TE with
  their stream continued (a `TaskMigrated` event, the JE's request migration when it is on);
  `recomputed`: affected requests that completed by running again from their prompt;
- `tokens_regenerated`: output tokens produced twice: those a failed task had streamed for a
  request that completed later (past its resume point when migrated), and those of passes rolled
  back and run again.
The `replace` rung is today's behaviour, the baseline of every other row of its fault.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec

from deepserve.actors.cluster.ladder import LadderChose, NodeRepaired, TeScaledIn
from deepserve.actors.cluster.state import TeDeclaredFailed, TeLaunching, TeReady, TeStopped
from deepserve.actors.flowserve.distflow.probe import LinkDiagnosed
from deepserve.actors.flowserve.master.recovery import HbmFaultMasked, IterationRolledBack
from deepserve.actors.flowserve.messages import TokenBatch
from deepserve.actors.gateway.messages import ApiRequest
from deepserve.actors.je.messages import JeTaskEnded, JobFinished, RouteDecided
from deepserve.actors.je.migration import KvImportEnded, TaskMigrated
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.faults import FaultSpec, fault_inputs
from deepserve.cluster.assembly import assemble
from deepserve.cluster.config import for_driver, load
from deepserve.cluster.run import arrivals
from deepserve.cluster.schema import PlatformConfig
from deepserve.core import SimDriver
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemorySink

PREFILL, DECODE = 2, 2
FAULT_AT_S = 20.0
HORIZON_S = 600.0  # virtual time a run may take to finish every request
STREAM = "ext/stream"
CLIENT = "ext/client"
# fault kind -> (the scenario's fault, its target: te/2's NPU, its RoCE NIC, or the TE itself)
FAULTS: dict[str, dict[str, Any]] = {
    "npu-crash": {"kind": "npu-crash", "target": "hw/s1/npu0"},
    "npu-hang": {"kind": "hang-npu", "target": "hw/s1/npu0"},
    # the first 0.5 % of its KV region: masking can keep the TE serving (otherwise the device is lost)
    "hbm-fault": {"kind": "hbm-fault", "target": "hw/s1/npu0", "span": (0.0, 0.005)},
    "link-down": {"kind": "link-down", "target": "s1/npu0/roce"},
    # the same NIC at 0.01 % of its bandwidth: KV transfers time out, a probe's dummy gets through
    "kv-saturation": {"kind": "link-degrade", "target": "s1/npu0/roce", "bw_factor": 0.0001},
    # a transient error of the NPU's collective link: the pass running fails, the device stays fine
    "link-transient": {"kind": "link-error", "target": "hw/s1/npu0"},
    "te-process-kill": {"kind": "kill-te-process", "target": f"te/{PREFILL}"},
    # the NPU of one DP group (dp/1) of te/2, in the same pool with 2 DP groups a TE
    "dp-npu-crash": {"kind": "npu-crash", "target": "hw/s1/npu1"},
    # te/2 of 4 colocated TEs serving long Mooncake conversations (its host DRAM may keep their KV)
    "colo-npu-crash": {"kind": "npu-crash", "target": "hw/s0/npu2"},
    "colo-process-kill": {"kind": "kill-te-process", "target": f"te/{PREFILL}"},
}
COLOCATED = ("cluster.mode=colocated", f"cluster.tes={PREFILL + DECODE}", "workload.trace=builtin:mooncake_conv_1k")
CLUSTER_OF: dict[str, tuple[str, ...]] = {"dp-npu-crash": ("cluster.dp_groups=2",), "colo-npu-crash": COLOCATED,
                                          "colo-process-kill": COLOCATED}  # a fault's own pool
TE_FAULTS = ("npu-crash", "npu-hang", "hbm-fault", "te-process-kill", "dp-npu-crash", "colo-npu-crash",
             "colo-process-kill")  # a TE is declared failed
RUNGS = ("replace", "restart-world", "pd-separate", "substitute")  # the cluster manager's (ladder.py)
# The rungs below the manager, each the baseline's config plus its setting: the JE's request
# migration, the engine's token recomputation and HBM masking (cluster.resilience), KV link probing
# (detection only: a link fault's diagnosis)
SETTINGS: dict[str, tuple[str, ...]] = {
    "migrate": ("scheduling.migration.enabled=true",),
    "token-recompute": ("cluster.resilience.token_recompute=true",),
    "hbm-mask": ("cluster.resilience.hbm_masking=true",),
    "link-probe": ("cluster.resilience.kv_link_probe_s=2.0",),
    # the JEs act on the probes' verdicts instead of the cool-down (actors/je/kvlinks.py) ...
    "link-route": ("cluster.resilience.kv_link_probe_s=2.0", "cluster.resilience.kv_link_routing=true"),
    # ... and the ladder's rung for a dead NIC: its TE serves whole requests as a colocated one
    "reroute": ("cluster.resilience.kv_link_probe_s=2.0", "cluster.resilience.kv_link_routing=true",
                "recovery.rung=reroute"),
    # request migration moving the KV that survived on the failed TE's host DRAM (written through
    # there by its masters) when cheaper than recomputing it (actors/flowserve/distflow/migrate.py)
    "migrate-kv": ("scheduling.migration.enabled=true", "scheduling.migration.kv=true", "cluster.kv_dram_gb=128",
                   "cluster.resilience.kv_backup=true"),
}
BASELINE = "replace"
EVENTS = frozenset(c.__name__ for c in (TeDeclaredFailed, TeLaunching, TeReady, TeStopped, LadderChose,
                                        NodeRepaired, TeScaledIn, JeTaskEnded, JobFinished, TaskMigrated, IterationRolledBack,
                                        HbmFaultMasked, LinkDiagnosed, RouteDecided, KvImportEnded))  # fmt: skip


class Cell(msgspec.Struct, kw_only=True):
    fault: str
    rung: str
    requests: int
    completed: int
    detected_s: float | None
    diagnosis: str
    recovered_s: float | None
    whole_s: float | None
    serving_min: int
    affected: int
    failed: int
    migrated: int
    recomputed: int
    tokens_regenerated: int
    choice: str  # the rung's recorded decision ("" for replace: it records none)
    target_tasks: int  # tasks routed to the fault's TE (te/2) after the fault: is it still of use
    e2e_s_max: float
    wall_s: float
    # KV migration (`migrate-kv`): requests moved with their KV pulled from the failed TE's host,
    # the blocks that crossed, and the prompt + client tokens prefilled again for the affected
    # requests that completed (what neither a cache hit nor a moved block covered)
    pool: str = ""  # the overrides of a fault with its own pool (`CLUSTER_OF`; "": the workload's)
    migrated_kv: int = 0
    kv_blocks_moved: int = 0
    tokens_recomputed: int = 0


def config(rung: str, fault: str, requests: int, seed: int, extra: Sequence[str] = ()) -> PlatformConfig:
    overrides = [f"cluster.prefill_tes={PREFILL}", f"cluster.decode_tes={DECODE}", f"workload.requests={requests}",
                 "log=none", f"seed={seed}", f"recovery.rung={rung if rung in RUNGS else BASELINE}",
                 "recovery.spare_servers=1", *SETTINGS.get(rung, ()), *CLUSTER_OF.get(fault, ()), *extra]  # fmt: skip
    cfg = load("pd-1p1d", overrides)
    return msgspec.structs.replace(cfg, faults=(FaultSpec(at_s=FAULT_AT_S, **FAULTS[fault]),))


def applicable(fault: str, stream: bool = False) -> tuple[str, ...]:
    """The rungs that act on `fault`: the manager's on a TE declared failed (a link fault declares
    none: its rows would repeat the baseline's), HBM masking on an HBM fault, token recomputation
    on a transient link error, link probing on a link down, migration on streamed requests only
    (an unstreamed one is run again from its prompt anyway)."""
    own = {"hbm-fault": ("hbm-mask",), "link-transient": ("token-recompute",),
           "link-down": ("link-probe", "link-route", "reroute"), "kv-saturation": ("link-probe", "link-route", "reroute")}
    rungs = (RUNGS if fault in TE_FAULTS else (BASELINE,)) + own.get(fault, ())
    # KV migration where a TE is lost with streams on it (a link fault leaves its HBM in place)
    return rungs + (("migrate",) if stream else ()) + (("migrate-kv",) if stream and fault in TE_FAULTS else ())


class Run(msgspec.Struct, kw_only=True):
    driver: SimDriver
    sink: MemorySink
    done: dict[str, RequestDone]  # request id -> its terminal answer
    requests: int
    wall_s: float


def simulate(rung: str, fault: str, requests: int = 200, seed: int = 0, stream: bool = False,
             extra: Sequence[str] = (), target: str = "", more: Sequence[FaultSpec] = ()) -> Run:  # fmt: skip
    """One cell's run, its whole log in memory; `extra`: more overrides, `target`: another one,
    `more`: faults after the cell's (a repair)."""
    cfg = config(rung, fault, requests, seed, extra)
    if target:
        cfg = msgspec.structs.replace(cfg, faults=(msgspec.structs.replace(cfg.faults[0], target=target),))
    if more:
        cfg = msgspec.structs.replace(cfg, faults=(*cfg.faults, *more))
    cfg = for_driver(cfg, "sim")
    sink = MemorySink()
    driver = SimDriver(cfg.seed, sink=sink)
    done: dict[str, RequestDone] = {}
    driver.on_external = lambda _t, env: (done.__setitem__(env.msg.request_id, env.msg)
                                          if type(env.msg) is RequestDone else None)  # fmt: skip
    built = assemble(driver, cfg, stream_to=STREAM)
    driver.run(until=0.0)
    for at, dst, msg in fault_inputs(cfg.faults):
        driver.inject(dst, msg, at=at, src="ext/fault")
    n = 0
    for at, a in arrivals(cfg.scenario(), None, None):
        if a is None:  # (only a partition's filter leaves a request out)
            continue
        driver.inject(built.gateway, ApiRequest(request_id=a.request_id, model=cfg.cluster.model, prompt=a.prompt,
                                                sampling=a.sampling, reply_to=CLIENT, stream=stream),
                      at=at, corr=a.request_id, src=CLIENT)  # fmt: skip
        n += 1
    t0 = time.perf_counter()
    while len(done) < n and driver.now < HORIZON_S and driver.pending():
        driver.run(max_deliveries=20_000)
    return Run(driver=driver, sink=sink, done=done, requests=n, wall_s=time.perf_counter() - t0)


def run_cell(rung: str, fault: str, requests: int = 200, seed: int = 0, stream: bool = False) -> Cell:
    r = simulate(rung, fault, requests, seed, stream)
    cell = _cell(rung, fault, r.requests, r.done, r.sink, r.wall_s)
    cell.pool = " ".join(CLUSTER_OF.get(fault, ()))
    return cell


def _read(sink: MemorySink) -> tuple[list[tuple[float, Any]], dict[str, int]]:
    """(t, event) of the events the table reads; output tokens streamed per task."""
    evs: list[tuple[float, Any]] = []
    tokens: dict[str, int] = {}
    for step in sink.steps:
        for ev in step.events:
            if ev.type in EVENTS:
                evs.append((step.input.t, decode(ev.type, ev.payload)))
        for out in step.outputs:
            if out.dst == STREAM and out.type == TokenBatch.__name__:
                for c in decode(out.type, out.payload).chunks:
                    tokens[c.task_id] = max(tokens.get(c.task_id, 0), c.first_index + len(c.times_s))
    return evs, tokens


def _detected(evs: list[tuple[float, Any]]) -> tuple[float | None, str]:
    """(after the fault, how): the TE declared failed, else the engine's own handling (a rollback,
    a masked HBM part) or a probed link's verdict."""
    te = f"te/{PREFILL}"
    for t, e in evs:
        if t < FAULT_AT_S:
            continue
        if type(e) is TeDeclaredFailed and e.te == te:
            return t - FAULT_AT_S, e.diagnosis
        if type(e) is IterationRolledBack:
            return t - FAULT_AT_S, "rolled back"
        if type(e) is HbmFaultMasked:
            return t - FAULT_AT_S, "masked"
        if type(e) is TeScaledIn:
            return t - FAULT_AT_S, "scaled in"
        if type(e) is LinkDiagnosed:
            return e.detected_s - FAULT_AT_S, e.verdict
    return None, ""


def _cell(rung: str, fault: str, n: int, done: dict[str, RequestDone], sink: MemorySink, wall: float) -> Cell:
    evs, tokens = _read(sink)
    detected_s, diagnosis = _detected(evs)
    relaunched: dict[str, float] = {}
    repaired_s = next((t for t, e in evs if type(e) is NodeRepaired), float("inf"))
    for t, e in evs:
        if type(e) is TeLaunching and e.replacing and FAULT_AT_S <= t < repaired_s:
            relaunched.setdefault(e.te, t)
    ready_at = {te_: next((t for t, e in evs if type(e) is TeReady and e.te == te_ and t >= t0), None)
                for te_, t0 in relaunched.items()}  # fmt: skip
    back = [t for t in ready_at.values() if t is not None]
    recovered = max(back) - FAULT_AT_S if back and len(back) == len(ready_at) else None
    failed_tasks = [e for t, e in evs if type(e) is JeTaskEnded and e.status == "failed" and t >= FAULT_AT_S]
    moved = {e.task_id: e for t, e in evs if type(e) is TaskMigrated and t >= FAULT_AT_S}
    migrated = {e.request_id for e in moved.values()}
    ok = {r for r, m in done.items() if m.status == "completed"}
    # a request failed after the fault without a task failing was refused for want of a TE
    hit = ({e.request_id for e in failed_tasks} | migrated
           | {r for r, m in done.items() if r not in ok and m.finish_s >= FAULT_AT_S})  # fmt: skip
    # tokens a failed task had sent, produced again by the next: all of them when it ran again from
    # its prompt; those past the resume point when migrated (the client had the rest); plus the
    # tokens of passes rolled back and run again (token recomputation)
    regenerated = sum(max(tokens.get(e.task_id, 0) - (moved[e.task_id].resume_from if e.task_id in moved else 0), 0)
                      for e in failed_tasks if e.request_id in ok)  # fmt: skip
    regenerated += sum(e.outputs for t, e in evs if type(e) is IterationRolledBack)
    choice = next((e.action for _, e in evs if type(e) is LadderChose), "")
    e2e = [m.finish_s - m.arrival_s for m in done.values()]
    imported = [e for t, e in evs if type(e) is KvImportEnded and e.ok and e.blocks]
    resumed = {e.request_id: e.resume_from for e in moved.values()}
    recomputed_tokens = sum(max(done[r].prompt_tokens + resumed.get(r, 0) - done[r].cached_prompt_tokens, 0)
                            for r in hit & ok)  # fmt: skip
    return Cell(fault=fault, rung=rung, requests=n, completed=len(ok), detected_s=detected_s, diagnosis=diagnosis,
                recovered_s=recovered, whole_s=_whole_s(evs), serving_min=_serving_min(evs), affected=len(hit),
                failed=len(hit - ok), migrated=len(migrated), recomputed=len((hit & ok) - migrated),
                tokens_regenerated=regenerated, choice=choice, e2e_s_max=max(e2e, default=0.0),
                target_tasks=sum(1 for t, e in evs if type(e) is RouteDecided and t >= FAULT_AT_S
                                 and e.decision.chosen == f"te/{PREFILL}"),
                wall_s=wall, migrated_kv=len({e.request_id for e in imported}),
                kv_blocks_moved=sum(e.blocks for e in imported), tokens_recomputed=recomputed_tokens)  # fmt: skip


def _ready_counts(evs: list[tuple[float, Any]]) -> list[tuple[float, int]]:
    """(t, TEs ready) after each change, from the fault on."""
    ready: dict[str, bool] = {}
    out = []
    for t, e in evs:
        if type(e) is TeReady:
            ready[e.te] = True
        elif type(e) in (TeDeclaredFailed, TeStopped):
            ready[e.te] = False
        else:
            continue
        if t >= FAULT_AT_S:
            out.append((t, sum(ready.values())))
    return out


def _whole_s(evs: list[tuple[float, Any]]) -> float | None:
    counts = _ready_counts(evs)
    if not counts:
        return None
    return next((t - FAULT_AT_S for t, n in counts if n == PREFILL + DECODE), None)


def _serving_min(evs: list[tuple[float, Any]]) -> int:
    ready: dict[str, bool] = {}
    low: int | None = None
    for t, e in evs:
        if type(e) is TeReady:
            ready[e.te] = True
        elif type(e) in (TeDeclaredFailed, TeStopped):
            ready[e.te] = False
        else:
            continue
        if t >= FAULT_AT_S:
            now = sum(ready.values())
            low = now if low is None else min(low, now)
    return sum(ready.values()) if low is None else low


def run_table(faults: Sequence[str] = tuple(FAULTS), requests: int = 200, seed: int = 0,
              rungs: Sequence[str] | None = None, stream: bool = False) -> list[Cell]:  # fmt: skip
    """Every (fault, rung that applies to it) cell; `rungs`: only these (None: all)."""
    return [run_cell(r, f, requests, seed, stream) for f in faults for r in applicable(f, stream)
            if rungs is None or r in rungs]  # fmt: skip


COLUMNS = ("fault", "rung", "detected_s", "recovered_s", "whole_s", "serving_min", "affected", "failed", "migrated",
           "recomputed", "tokens_regenerated", "completed", "target_tasks", "migrated_kv", "kv_blocks_moved",
           "tokens_recomputed")  # fmt: skip


def render(cells: Sequence[Cell]) -> str:
    def fmt(v: object) -> str:
        if v is None:
            return "-"
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    rows = [COLUMNS] + [tuple(fmt(getattr(c, k)) for k in COLUMNS) for c in cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths, strict=True)))
             for r in rows]  # fmt: skip
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
