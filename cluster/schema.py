"""One config for `deepserve sim` and `deepserve up` (issue 31 §1): TE groups of any mix, the
control plane, scheduling, SLOs, faults; the workload (`sim` only) and the HTTP settings (`up`
only). Data only, as msgspec Structs: every field typed and bounded, so a bad value is refused
naming its dotted key; `check` holds the rules that span fields.

TE groups: `[cluster]` is the first group (colocated or P/D, as in every scenario file), `[pd]`
a P/D pool of the same model beside it (the daemon's), `[[groups]]` any further group — its own
model, mode and sizes, each table a `[cluster]` (same topology and KV block size: one fabric,
one prompt tree).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.cluster.autoscaler_config import Autoscale
from deepserve.actors.cluster.ladder import Recovery
from deepserve.actors.cluster.prewarm import Scaling
from deepserve.adapters.scenario.control import ControlPlane
from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.adapters.scenario.sched import Scheduling
from deepserve.adapters.scenario.schema import Cluster, Scenario, Workload

Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
Seed = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]  # the log's 64-bit column


class Daemon(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`deepserve up`'s HTTP side (ignored by `sim`)."""

    host: str = "127.0.0.1"
    port: Port = 8000  # 0: a free port (printed at start)
    run_dir: str = ""  # "": runs/daemon-<UTC time>
    log_format: Literal["console", "json"] = "console"
    ingress: str = "gateway"  # the gateway's address: the one actor the frontend sends requests to
    served_model_name: str = ""  # "": the cluster's model name
    tokenizer: str = "approx"  # or a path to a Hugging Face tokenizer.json
    seed: Seed = 0  # as `sim --seed`
    admin_host: str = "127.0.0.1"
    admin_port: Port = 0  # 0: a free port (printed at start, and written to the run dir)
    # The admin API's bearer token ("": none; required when admin_host is not loopback). Never on
    # the command line (`ps` shows it to every user): in a config file, in the file
    # `admin_token_file` names, or in $DEEPSERVE_ADMIN_TOKEN (daemon/auth.py).
    admin_token: str = ""
    admin_token_file: str = ""
    max_inflight: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096  # then 429
    max_prompt_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 22)] = 32_768
    max_tokens_limit: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 8192
    ttft_deadline_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0  # then 504
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 4 << 20
    # A request field nobody declared: "error" (a 400 naming it: typos are caught) or "warn"
    # (dropped, one warning per field name, as vLLM does). README, "Request fields".
    unknown_fields: Literal["error", "warn"] = "error"


class PdPool(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A P/D-disaggregated pool beside the colocated TEs (same model, hardware and scheduler)."""

    prefill_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0  # 0: no P/D pool
    decode_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0
    link: Literal["roce", "hccs", "ub"] = "roce"
    kv_transfer: Literal["contiguous", "block"] = "contiguous"


class Slo(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The targets a request meets to count as attained in `sim`'s summary (`slo_attainment`:
    completed requests within both, over every request). Defaults: an interactive chat target
    (assumption, not from a paper: DistServe's chatbot SLOs are of this order)."""

    ttft_ms: Annotated[float, msgspec.Meta(gt=0, le=3.6e6)] = 2000.0
    tpot_ms: Annotated[float, msgspec.Meta(gt=0, le=3.6e6)] = 100.0


class PlatformConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    name: str = "scenario"
    description: str = ""
    seed: Seed = 0  # `sim`'s run seed (`up` uses daemon.seed)
    log: str = ""  # sim: "" = runs/<name>-<seed>.db; "none" = no log
    cluster: Cluster = msgspec.field(default_factory=Cluster)  # the first TE group
    pd: PdPool = msgspec.field(default_factory=PdPool)  # a P/D pool of the first group's model
    groups: tuple[Cluster, ...] = ()  # further TE groups (other models, modes)
    control: ControlPlane = msgspec.field(default_factory=ControlPlane)
    recovery: Recovery = msgspec.field(default_factory=Recovery)  # the recovery ladder's rung
    scaling: Scaling = msgspec.field(default_factory=Scaling)  # fast scaling (DeepServe §6), off by default
    autoscale: Autoscale = msgspec.field(default_factory=Autoscale)  # issue 34 §5; off by default
    scheduling: Scheduling = msgspec.field(default_factory=Scheduling)
    slo: Slo = msgspec.field(default_factory=Slo)
    faults: tuple[FaultSpec, ...] = ()
    workload: Workload = msgspec.field(default_factory=Workload)  # sim only
    daemon: Daemon = msgspec.field(default_factory=Daemon)  # up only

    def scenario(self) -> Scenario:
        """The first group as a scenario (what the per-TE sizing and the trace reader take)."""
        return Scenario(name=self.name, description=self.description, seed=self.seed, log=self.log,
                        cluster=self.cluster, workload=self.workload, scheduling=self.scheduling,
                        faults=self.faults)  # fmt: skip

    def pd_scenario(self) -> Scenario | None:
        """The P/D pool as a scenario of its own (None when there is none)."""
        p = self.pd
        if not (p.prefill_tes or p.decode_tes):
            return None
        c = msgspec.structs.replace(self.cluster, mode="pd", prefill_tes=max(p.prefill_tes, 1),
                                    decode_tes=max(p.decode_tes, 1), link=p.link, kv_transfer=p.kv_transfer)  # fmt: skip
        return Scenario(name=f"{self.name}-pd", seed=self.seed, cluster=c)

    def group_scenarios(self) -> list[tuple[str, Scenario]]:
        """Every TE group as (config key, scenario): `cluster`, `pd`, `groups.N`."""
        out = [("cluster", Scenario(name=self.name, seed=self.seed, cluster=self.cluster))]
        pd = self.pd_scenario()
        if pd is not None:
            out.append(("pd", pd))
        out += [(f"groups.{i}", Scenario(name=f"{self.name}-{i}", seed=self.seed, cluster=g))
                for i, g in enumerate(self.groups)]  # fmt: skip
        return out

    def models(self) -> tuple[str, ...]:
        """The models served, in group order, each once."""
        return tuple(dict.fromkeys(s.cluster.model for _, s in self.group_scenarios()))

    def model_name(self) -> str:
        return self.daemon.served_model_name or self.cluster.model


def roles(c: Cluster) -> tuple[str, ...]:
    return ("prefill", "decode") if c.mode == "pd" else ("colocated",)


def check(cfg: PlatformConfig, known_models: tuple[str, ...]) -> list[tuple[str, str]]:
    """(dotted key, problem) of every rule spanning fields or groups; [] when the config holds."""
    from deepserve.adapters.scenario.faults import check_faults
    from deepserve.adapters.scenario.schema import check as check_group

    problems: list[tuple[str, str]] = []
    first = cfg.cluster
    seen: dict[str, str] = {}
    for key, s in cfg.group_scenarios():
        # the first group's check also covers [scheduling] (its policy, heatmap, predictor)
        s = cfg.scenario() if key == "cluster" else s
        s = msgspec.structs.replace(s, faults=())  # faults are checked on the whole cluster below
        problems += [(k.replace("cluster.", f"{key}.", 1) if key != "cluster" else k, p)
                     for k, p in check_group(s, known_models)]  # fmt: skip
        c = s.cluster
        if key.startswith("groups."):
            for name in ("topology", "hardware", "kv_block_tokens"):
                if getattr(c, name) != getattr(first, name):
                    problems.append((f"{key}.{name}", f"must equal cluster.{name} ({getattr(first, name)!r}): "
                                                      "one fabric and one prompt tree serve every group"))  # fmt: skip
        for role in roles(c):
            group = f"{c.model}/{role}"
            if group in seen:
                problems.append((key, f"serves {group} as {seen[group]} does: one group per model and role "
                                      "(raise that group's TE count instead)"))  # fmt: skip
            seen.setdefault(group, key)
    if bool(cfg.pd.prefill_tes) != bool(cfg.pd.decode_tes):
        zero = "pd.prefill_tes" if not cfg.pd.prefill_tes else "pd.decode_tes"
        problems.append((zero, "a P/D pool needs both prefill_tes and decode_tes >= 1 (or both 0: no pool)"))
    problems += check_recovery(cfg)
    for i, m in enumerate(cfg.workload.models):
        if m not in cfg.models():
            problems.append((f"workload.models.{i}", f"{m!r} is served by no group (served: {', '.join(cfg.models())})"))
    problems += _check_scaling(cfg)
    if cfg.faults and not problems:
        from .assembly import je_addrs
        from .layout import plan

        layout = plan(cfg)
        problems += check_faults(cfg.faults, first.topology, layout.servers, tes=started_tes(layout),
                                 jes=je_addrs(cfg) if cfg.scheduling.entry == "gateway" else ())  # fmt: skip
    return problems


def check_recovery(cfg: PlatformConfig) -> list[tuple[str, str]]:
    r = cfg.recovery
    if r.rung == "substitute" and r.spare_servers < 1:
        return [("recovery.spare_servers", "substitute needs a spare pool: at least 1 spare server")]
    if r.rung == "reroute" and not any(s.cluster.resilience.kv_link_routing for _, s in cfg.group_scenarios()):
        return [("recovery.rung", "reroute acts on KV link verdicts: needs cluster.resilience.kv_link_routing = true")]
    if r.rung != "replace" and not cfg.control.heartbeats:
        return [("recovery.rung", f"{r.rung} acts on a TE declared failed: needs control.heartbeats = true")]
    return []


def _check_scaling(cfg: PlatformConfig) -> list[tuple[str, str]]:
    """`[scaling]`: settings without `enabled` would silently do nothing; a server's pre-warmed
    executors sit on its NPUs."""
    from deepserve.adapters.hardware.specs import npu_spec, server_spec

    sc, default = cfg.scaling, type(cfg.scaling)()
    if not sc.enabled:
        changed = [k for k in sc.__struct_fields__ if getattr(sc, k) != getattr(default, k)]
        return [(f"scaling.{changed[0]}", "set scaling.enabled = true too (the pipeline is off)")] if changed else []
    kind = {"gen1": "gen1-910b", "cm384": "cm384-910c"}.get(cfg.cluster.topology, "gen1-910b")
    npus = server_spec(kind).npus
    if sc.executor_pool_per_server > npus:
        return [("scaling.executor_pool_per_server",
                 f"at most the {npus} {npu_spec(server_spec(kind).npu).kind} NPUs of a {kind} server, "
                 f"got {sc.executor_pool_per_server}")]  # fmt: skip
    return []


def started_tes(layout: Any) -> tuple[str, ...]:
    """The TEs the cluster starts with (a fault may target them): each group's first slots, not
    the spare ones (`control.spare_tes`, launched only by `deepserve scale`)."""
    left = dict(layout.groups)
    out = []
    for slot in layout.slots:
        if left.get(slot.group, 0) > 0:
            left[slot.group] -= 1
            out.append(slot.te)
    return tuple(out)
