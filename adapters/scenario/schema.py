"""The scenario file: a cluster, a workload, a seed and a log — as msgspec Structs.

Every field has a type and bounds, so `msgspec.convert` rejects a bad value naming its path; the
checks that span fields (TEs fit the servers, PD needs a link, ...) are in `check`. A scenario is
data only: deepserve/cluster/ turns it into actors (assembly.py) and runs it (run.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from .faults import FaultSpec, check_faults
from .resilience import Resilience
from .sched import Scheduling, check_scheduling

Pos = Annotated[int, msgspec.Meta(ge=1)]
NonNeg = Annotated[int, msgspec.Meta(ge=0)]


class Scheduler(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The DP-group master's knobs (FlowServe's scheduler, issue 10 §3)."""

    max_batch_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 8192  # token budget
    max_running: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 256  # sequences in a batch
    chunked_prefill: bool = True
    schedule_gap_ms: Annotated[float, msgspec.Meta(ge=0, le=1000)] = 0.5  # CPU time between steps
    max_waiting: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 100_000  # queue bound
    eos_rate: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0  # trace replay ignores EOS
    # "lognormal": output lengths drawn from lognormal(mu, sigma) instead of eos_rate a token;
    # the defaults are fitted to the Azure 2023 conversation trace (adapters/traces/fit_lengths.py)
    eos_model: Literal["rate", "lognormal"] = "rate"
    eos_lognormal_mu: Annotated[float, msgspec.Meta(ge=0, le=20)] = 5.019
    eos_lognormal_sigma: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.859
    # "collaborative": the TE shell's DP balancer (xDeepServe §4.3); "round_robin": the baseline.
    balancer: Literal["collaborative", "round_robin"] = "collaborative"
    # KV pool: blocks per DP group; 0 = what HBM holds after weights (the normal case).
    kv_blocks: Annotated[int, msgspec.Meta(ge=0, le=1 << 24)] = 0
    decode_kv_blocks: Annotated[int, msgspec.Meta(ge=0, le=1 << 24)] = 0  # PD: D side only
    # The simulation fast path: a decode batch nothing changes runs k passes as one NPU request
    # (same per-token times as stepping; the daemon always steps).
    aggregate: bool = True
    # Emulated token ids in TaskTokens; the workload actor reads only the times, so sims skip them.
    stream_token_ids: bool = False


class Cluster(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    hardware: Literal["910b", "910c"] = "910b"
    topology: Literal["gen1", "cm384"] = "gen1"
    model: str = "llama3-8b"
    mode: Literal["colocated", "pd"] = "colocated"
    tes: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1  # colocated TEs
    prefill_tes: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1  # mode = "pd"
    decode_tes: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1  # mode = "pd"
    tp: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    dp_groups: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1  # DP groups per TE
    kv_block_tokens: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 128
    prefix_caching: bool = True
    # Host DRAM per DP group for the RTC's DRAM tier (swap-out of cold blocks, populate on a
    # hit: Mooncake's KV pool idea); 0 = HBM only.
    kv_dram_gb: Annotated[float, msgspec.Meta(ge=0, le=4096)] = 0.0
    link: Literal["roce", "hccs", "ub"] = "roce"  # between the P and D TEs (mode = "pd")
    kv_transfer: Literal["contiguous", "block"] = "contiguous"  # P/D-Serve block-free or per block
    # Seeded per-forward variance of the emulated NPUs (docs/devices.md); off: the model's mean.
    npu_variance: bool = True
    scheduler: Scheduler = msgspec.field(default_factory=Scheduler)
    resilience: Resilience = msgspec.field(default_factory=Resilience)  # resilience.py (all off)

    def te_count(self) -> int:
        return self.tes if self.mode == "colocated" else self.prefill_tes + self.decode_tes

    def npus_per_te(self) -> int:
        return self.tp * self.dp_groups


class Workload(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # A path (Mooncake JSONL or Azure CSV, told apart by content) or "builtin:NAME".
    trace: str = "builtin:azure_conv_500"
    requests: Annotated[int, msgspec.Meta(ge=0, le=10_000_000)] = 0  # 0 = the whole trace
    rps_scale: Annotated[float, msgspec.Meta(gt=0, le=1e6)] = 1.0  # > 1 compresses arrivals
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1 << 20  # cap on any output
    # The models requests ask for, in turn by trace position (several groups serve several
    # models); empty: the first group's model (the cluster's, for a one-model scenario).
    models: tuple[str, ...] = ()


class Scenario(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: str = "scenario"
    description: str = ""
    seed: Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)] = 0  # as --seed: 64-bit signed
    log: str = ""  # "" = runs/<name>-<seed>.db; "none" = no log
    cluster: Cluster = msgspec.field(default_factory=Cluster)
    workload: Workload = msgspec.field(default_factory=Workload)
    # Issue 6: gateway + JEs + a routing policy instead of the workload stand-in (sched.py).
    scheduling: Scheduling | None = None
    faults: tuple[FaultSpec, ...] = ()  # hardware faults at virtual times (faults.py)
    # The platform's `[control]` (cluster/schema.py reads it: `deepserve sim`); this runner has
    # no control plane, so a scenario file that sets it (mooncake-16te's heartbeat leases) loads here too
    control: dict[str, Any] = {}
    # the platform's `[autoscale]` (cluster/schema.py; burst-autoscale's): likewise read there only
    autoscale: dict[str, Any] = {}


HARDWARE_OF_TOPOLOGY = {"gen1": "910b", "cm384": "910c"}
LINKS_OF_TOPOLOGY = {"gen1": ("roce", "hccs"), "cm384": ("ub",)}
MAX_SERVERS = {"gen1": 1024, "cm384": 48}
NPUS_PER_SERVER = {"gen1": 8, "cm384": 16}
DRAM_GB_PER_SERVER = {"gen1": 1500, "cm384": 1500}  # specs.SERVERS dram_bytes (checked in tests)


def _layout_problems(c: Cluster) -> list[tuple[str, str]]:
    """The model's own layout rules for a TE's TP group (tp dividing the attention heads, ...),
    checked here as the NPU would check every forward: else every request fails at run time."""
    from deepserve.adapters.hardware.batch import Batch, Parallel, Seq, validate
    from deepserve.adapters.hardware.memory import kv_capacity_tokens
    from deepserve.adapters.hardware.models import model_profile
    from deepserve.adapters.hardware.specs import npu_spec

    m = model_profile(c.model)
    try:
        validate(m, Batch(seqs=(Seq(1, 0),)), Parallel(tp=c.tp))
    except ValueError as exc:
        return [("cluster.tp", str(exc).removeprefix("tp: "))]
    if kv_capacity_tokens(m, npu_spec(c.hardware), Parallel(tp=c.tp)) < c.kv_block_tokens:
        # the builder's KV sizing (kv_sizing) would find no block: refused here, not at run time
        return [("cluster.model", f"{c.model} leaves no HBM for KV on a {c.hardware} at tp={c.tp}")]
    return []


# The other keys each cross-field rule of `check` reads, by the key it reports: the problem at
# `cluster.hardware` may be the `--set cluster.topology=cm384` that made it, and an error must
# name what the user wrote, not the default file that set the key it reports.
RELATED: dict[str, tuple[str, ...]] = {
    "cluster.model": ("cluster.hardware", "cluster.topology", "cluster.tp"),
    "cluster.hardware": ("cluster.topology",),
    "cluster.link": ("cluster.topology", "cluster.mode"),
    "cluster.tp": ("cluster.dp_groups", "cluster.topology", "cluster.model"),
    "cluster.tes": ("cluster.topology", "cluster.tp", "cluster.dp_groups"),
    "cluster.prefill_tes": ("cluster.decode_tes", "cluster.topology", "cluster.tp", "cluster.dp_groups"),
    "cluster.kv_dram_gb": ("cluster.topology", "cluster.tp", "cluster.dp_groups", "cluster.tes"),
    "cluster.scheduler.max_batch_tokens": ("cluster.kv_block_tokens", "cluster.scheduler.chunked_prefill"),
}


def check(s: Scenario, known_models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(dotted key, problem) for every rule spanning fields; empty when the scenario holds."""
    c = s.cluster
    problems: list[tuple[str, str]] = []
    if c.model not in known_models:
        problems.append(("cluster.model", f"unknown model {c.model!r}; known: {', '.join(known_models)}"))
    if HARDWARE_OF_TOPOLOGY[c.topology] != c.hardware:
        problems.append((
            "cluster.hardware",
            f"{c.hardware!r} does not match topology {c.topology!r} "
            f"(which has {HARDWARE_OF_TOPOLOGY[c.topology]!r})",
        ))  # fmt: skip
    if c.mode == "pd" and c.link not in LINKS_OF_TOPOLOGY[c.topology]:
        problems.append((
            "cluster.link",
            f"{c.link!r} is not a link of topology {c.topology!r} "
            f"(it has {', '.join(LINKS_OF_TOPOLOGY[c.topology])})",
        ))  # fmt: skip
    per_server = NPUS_PER_SERVER[c.topology]
    if c.npus_per_te() > per_server:
        problems.append((
            "cluster.tp",
            f"tp {c.tp} x dp_groups {c.dp_groups} = {c.npus_per_te()} NPUs per TE; "
            f"a {c.topology} server has {per_server}",
        ))  # fmt: skip
    elif c.model in known_models:
        problems += _layout_problems(c)
    from .placement import place  # placement builds on this module's types

    servers = place(c).servers if c.npus_per_te() <= per_server else 0
    if servers > MAX_SERVERS[c.topology]:
        key = "cluster.tes" if c.mode == "colocated" else "cluster.prefill_tes"
        problems.append((key, f"needs {servers} servers; {c.topology} has at most {MAX_SERVERS[c.topology]}"))
    groups_per_server = min(per_server // max(c.npus_per_te(), 1), c.te_count()) * c.dp_groups
    dram_gb = DRAM_GB_PER_SERVER[c.topology]
    if c.kv_dram_gb * groups_per_server > dram_gb:
        problems.append((
            "cluster.kv_dram_gb",
            f"{c.kv_dram_gb} GB x {groups_per_server} DP groups on a server exceeds its {dram_gb} GB of DRAM",
        ))  # fmt: skip
    if c.resilience.kv_backup and c.kv_dram_gb <= 0:
        problems.append(("cluster.resilience.kv_backup", "needs a DRAM tier: set cluster.kv_dram_gb > 0"))
    if c.scheduler.max_batch_tokens < c.kv_block_tokens and not c.scheduler.chunked_prefill:
        problems.append(("cluster.scheduler.max_batch_tokens", "is below one KV block without chunked prefill"))
    problems += check_scheduling(s)
    if s.faults and servers:
        problems += check_faults(s.faults, c.topology, servers)
    return problems

