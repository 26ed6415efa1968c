"""`deepserve bench policies`: the scheduling policies of issue 6 compared on traces, clusters
and a grid of request rates (DeepServe §5 Fig. 7; P/D-Serve §3.5 for the forwarding modes).

A cluster is mixed: colocated TEs plus PD pairs of one model (DeepServe Fig. 7: two colocated
TEs and one 1P1D pair of a 34B model at TP=4). Each (policy, trace, cluster, rps) cell is one
simulated run through gateway -> JE -> FlowServe TEs; the trace's first `requests` arrivals are
time-scaled to the target rate. Metrics per cell: JCT (arrival to last token), TTFT, TPOT
p50/p99, SLO attainment (share of all arrivals completing within both the TTFT and the TPOT SLO)
and the prefix hit rate.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.loader import trace_path
from deepserve.adapters.scenario.placement import Placement, TePlacement
from deepserve.adapters.scenario.sched import Forwarding, Scheduling
from deepserve.adapters.scenario.schema import NPUS_PER_SERVER, Cluster, Scenario, Workload, check
from deepserve.adapters.traces import open_trace
from deepserve.cluster.assembly import WORKLOAD_ADDR, announce_tes, spawn_scheduling
from deepserve.cluster.run import run_scenario
from deepserve.cluster.te import spawn_te

PREFILL_SLOTS = 4  # on-demand: tasks a prefill DP group holds before it refuses
DEFAULT_TRACES = ("builtin:azure_conv_500", "builtin:mooncake_conv_1k")
DEFAULT_POLICIES = ("round_robin", "least_load", "locality", "load_aware", "pd_aware", "combined")
ROW_FIELDS = ("policy", "trace", "cluster", "rps", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
              "tpot_ms_p99", "jct_ms_p50", "jct_ms_p99", "slo_attainment", "prefix_hit_rate")


class ClusterSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A mixed cluster: `colocated` TEs and `pairs` PD pairs (one prefill + one decode TE)."""

    name: str = "custom"
    model: str = "codellama-34b"
    hardware: Literal["910b", "910c"] = "910b"
    topology: Literal["gen1", "cm384"] = "gen1"
    link: Literal["roce", "hccs", "ub"] = "roce"
    tp: Annotated[int, msgspec.Meta(ge=1, le=16)] = 4
    colocated: Annotated[int, msgspec.Meta(ge=0, le=256)] = 2
    pairs: Annotated[int, msgspec.Meta(ge=0, le=256)] = 1
    kv_block_tokens: Annotated[int, msgspec.Meta(ge=16, le=4096)] = 128


CLUSTERS = {
    "fig7": ClusterSpec(name="fig7", colocated=2, pairs=1),  # DeepServe Fig. 7
    "large": ClusterSpec(name="large", colocated=6, pairs=3),
}


def load_cluster(spec: str) -> ClusterSpec:
    """A built-in cluster name, or a TOML file of ClusterSpec fields; ValueError names the field."""
    if spec in CLUSTERS:
        return CLUSTERS[spec]
    p = Path(spec)
    if not p.is_file():
        raise ValueError(f"--cluster: {spec!r} is neither a built-in cluster ({', '.join(CLUSTERS)}) nor a file")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
        c = msgspec.convert({"name": p.stem, **doc}, ClusterSpec)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--cluster {spec}: invalid TOML: {exc}") from None
    except msgspec.ValidationError as exc:
        raise ValueError(f"--cluster {spec}: {exc}") from None
    if c.colocated + c.pairs == 0:
        raise ValueError(f"--cluster {spec}: colocated + pairs must be >= 1")
    return c


def scenario_of(c: ClusterSpec, sch: Scheduling, trace: str, requests: int, rps_scale: float, seed: int) -> Scenario:
    cluster = Cluster(hardware=c.hardware, topology=c.topology, model=c.model, mode="colocated",
                      tes=max(c.colocated + 2 * c.pairs, 1), tp=c.tp, link=c.link,
                      kv_block_tokens=c.kv_block_tokens)  # sizing and checks; placement is ours
    s = Scenario(name=f"policies-{c.name}", seed=seed, log="none", cluster=cluster, scheduling=sch,
                 workload=Workload(trace=trace, requests=requests, rps_scale=rps_scale))
    from deepserve.adapters.hardware.models import known_models

    for key, problem in check(s, known_models()):
        raise ValueError(f"--cluster {c.name}: {key} {problem}")
    return s


def mixed_placement(c: ClusterSpec) -> Placement:
    """Colocated TEs packed first; prefill TEs next; decode TEs on fresh servers over RoCE (the
    KV crosses the NICs, as in scenario placement)."""
    per_server = NPUS_PER_SERVER[c.topology]
    slots = per_server // c.tp
    tes: list[TePlacement] = []
    server, slot = 0, 0
    for gi, (role, count) in enumerate((("colocated", c.colocated), ("prefill", c.pairs), ("decode", c.pairs))):
        if gi == 2 and c.link == "roce" and slot > 0:
            server, slot = server + 1, 0
        for _ in range(count):
            if slot == slots:
                server, slot = server + 1, 0
            npus = tuple(f"hw/s{server}/npu{j}" for j in range(slot * c.tp, (slot + 1) * c.tp))
            tes.append(TePlacement(f"te/{len(tes)}", role, server, npus))
            slot += 1
    return Placement(server + 1, tuple(tes))


def build_mixed(c: ClusterSpec, prefill_slots: int = 0) -> Callable[[Any, Scenario], Placement]:
    """`prefill_slots` > 0: prefill DP groups hold at most that many tasks and refuse the rest
    (P/D-Serve's prefill without a local queue); 0: the normal bounded-but-large queue."""
    def build(driver: Any, s: Scenario) -> Placement:
        from deepserve.actors.flowserve.te_shell import TeShell
        from deepserve.adapters.hardware.devices.topology import build as topo
        from deepserve.adapters.hardware.devices.topology import spawn_topology
        from deepserve.cluster.te import te_config

        placement = mixed_placement(c)
        spawn_topology(driver, topo(c.topology, placement.servers), variance=s.cluster.npu_variance)
        spawn_scheduling(driver, s, placement, WORKLOAD_ADDR)
        for te in placement.tes:
            if prefill_slots and te.role == "prefill":
                cfg = te_config(s, te)
                cfg["dps"] = [{**dp, "max_waiting": prefill_slots} for dp in cfg["dps"]]
                driver.spawn(te.addr, TeShell, config=cfg)
            else:
                spawn_te(driver, s, te)
        announce_tes(driver, s, placement)
        return placement

    return build


def native_rps(trace: str, requests: int) -> float:
    """The trace's own arrival rate over its first `requests` requests."""
    times = [r.arrival_s for r in open_trace(trace_path(trace)).head(requests)]
    if len(times) < 2 or times[-1] <= times[0]:
        raise ValueError(f"--trace {trace}: needs at least 2 requests with distinct arrival times")
    return (len(times) - 1) / (times[-1] - times[0])


class Slo(msgspec.Struct, frozen=True):
    ttft_ms: float
    tpot_ms: float


def run_cell(policy: str, trace: str, c: ClusterSpec, rps: float, requests: int, slo: Slo,
             heatmap: str, predictor: str = "", seed: int = 0, forwarding: str = "") -> dict[str, Any]:
    """One row: the policy on the cluster at `rps`, first `requests` requests of the trace.
    `forwarding` "" = the default (prefill queues locally); "on_demand" / "local_queue": the
    P/D-Serve comparison — on_demand prefills keep `PREFILL_SLOTS` tasks and refuse the rest,
    the JE re-offers until the TTFT SLO; the row's policy reads `policy/forwarding`."""
    pd = policy in ("pd_aware", "combined")
    # A 50 ms sweep backoff: each refused sweep costs a message per prefill, and 5 ms sweeps
    # under overload make the simulation (not the emulated cluster) slow.
    fw = Forwarding(mode=forwarding or "local_queue", ttft_deadline_s=slo.ttft_ms / 1e3,  # type: ignore[arg-type]
                    retry_backoff_s=0.05)
    sch = Scheduling(policy=policy, heatmap=heatmap if pd else "", predictor=predictor if pd else "",  # type: ignore[arg-type]
                     forwarding=fw if forwarding else Forwarding())
    scale = rps / native_rps(trace, requests)
    s = scenario_of(c, sch, trace, requests, scale, seed)
    met = [0]

    def on_done(d: RequestDone) -> None:
        if d.status != "completed" or d.first_token_s is None:
            return
        ttft = (d.first_token_s - d.arrival_s) * 1e3
        tpot = (d.finish_s - d.first_token_s) * 1e3 / (d.output_tokens - 1) if d.output_tokens > 1 else 0.0
        met[0] += ttft <= slo.ttft_ms and tpot <= slo.tpot_ms

    slots = PREFILL_SLOTS if forwarding == "on_demand" else 0
    r = run_scenario(s, build=build_mixed(c, slots), requests=requests, on_done=on_done)
    m = r.summary
    name = trace.removeprefix("builtin:")
    return {
        "policy": f"{policy}/{forwarding}" if forwarding else policy, "trace": name, "cluster": c.name, "rps": rps,
        "ttft_ms_p50": m["ttft_ms_p50"], "ttft_ms_p99": m["ttft_ms_p99"],
        "tpot_ms_p50": m["tpot_ms_p50"], "tpot_ms_p99": m["tpot_ms_p99"],
        "jct_ms_p50": m["e2e_ms_p50"], "jct_ms_p99": m["e2e_ms_p99"],
        "slo_attainment": met[0] / max(r.injected, 1), "prefix_hit_rate": m["prefix_hit_rate"],
        "_completed": m["completed"], "_requests": r.injected, "_wall_s": r.wall_s,
    }  # fmt: skip


def fmt(x: float) -> str:
    return "-" if isinstance(x, float) and math.isnan(x) else f"{x:,.1f}" if abs(x) >= 10 else f"{x:.3f}"


def render_table(rows: list[dict[str, Any]], cluster: str) -> str:
    head = ("trace", "rps", "policy", "jct p50", "jct p99", "ttft p50", "ttft p99", "tpot p50",
            "tpot p99", "slo", "hit rate", "done")
    lines = [head]
    for r in rows:
        if r["cluster"] != cluster:
            continue
        lines.append((r["trace"], f"{r['rps']:g}", r["policy"], fmt(r["jct_ms_p50"]), fmt(r["jct_ms_p99"]),
                      fmt(r["ttft_ms_p50"]), fmt(r["ttft_ms_p99"]), fmt(r["tpot_ms_p50"]),
                      fmt(r["tpot_ms_p99"]), f"{r['slo_attainment']:.3f}", f"{r['prefix_hit_rate']:.3f}",
                      f"{r['_completed']}/{r['_requests']}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = [f"cluster {cluster} (times in ms)"]
    for n, line in enumerate(lines):
        out.append("  ".join(x.ljust(w) if i < 3 else x.rjust(w) for i, (x, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """JCT p50 against RPS, one line per policy, one panel per (cluster, trace)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["cluster"], r["trace"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (cluster, trace) in zip(axes[0], panels, strict=True):
        for policy in sorted({r["policy"] for r in rows}):
            pts = sorted((r["rps"], r["jct_ms_p50"] / 1e3) for r in rows
                         if (r["cluster"], r["trace"], r["policy"]) == (cluster, trace, policy))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        ax.set(title=f"{cluster} / {trace}", xlabel="RPS", ylabel="JCT p50 (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
