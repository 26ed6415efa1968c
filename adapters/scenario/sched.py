"""A config's `scheduling` section, data and checks only (the wiring that spawns the gateway, JEs
and cluster manager from it is deepserve/cluster/assembly.py): `entry` says how requests enter,
`jes` JEs run the named policy.

    [scheduling]
    policy = "combined"            # round_robin, least_load, locality, load_aware (default), pd_aware, combined
    params = { threshold = 4 }     # the policy's parameters (validated)
    heatmap = "runs/heatmap.json"  # pd_aware / combined on a mixed group (`deepserve profile heatmap`)
    jes = 2
    [scheduling.forwarding]
    mode = "on_demand"             # or "local_queue"
    ttft_deadline_s = 10.0
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.scheduling import DEFAULT_POLICY


class Forwarding(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    mode: Literal["on_demand", "local_queue"] = "on_demand"
    ttft_deadline_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    retry_backoff_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.005
    max_backoff_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 0.5  # sweeps back off up to this
    accept_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 5.0


class Migration(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`[scheduling.migration]`: a streamed request on a failed TE moves to another and its
    stream continues (xLLM §3.5, actors/je/migration.py), the failed task's remains cleaned up
    (P/D-Serve §3.4 zombie protection). Off: it fails with the reason, as before."""

    enabled: bool = False
    max_migrations: Annotated[int, msgspec.Meta(ge=1, le=64)] = 3
    # >0: the JE asks the live frontend how far the client's stream got, and waits this long for
    # the answer before resuming at what it knows itself (the first chunk of each task; `up` only)
    ask_stream_s: Annotated[float, msgspec.Meta(ge=0, le=60)] = 0.0
    # Move the KV that survived on the failed TE's host DRAM when cheaper than recomputing it
    # (actors/flowserve/distflow/migrate.py; the masters write it through with
    # `cluster.resilience.kv_backup`, which needs `cluster.kv_dram_gb` > 0)
    kv: bool = False
    # Live migration: a draining TE's streams move with their KV (read from its HBM) at once
    # instead of holding it until they finish (needs `kv`)
    live: bool = False


class Scheduling(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    # How requests enter: "gateway" (the platform: gateway -> JE -> TE, with the control plane)
    # or "dispatcher" (`deepserve sim` only: the workload stand-in's round robin straight to the
    # TEs, no JE nor control plane — what `--workers N` splits over processes).
    entry: Literal["gateway", "dispatcher"] = "gateway"
    policy: Literal["round_robin", "least_load", "locality", "load_aware", "pd_aware", "combined"] = DEFAULT_POLICY  # type: ignore[assignment]
    params: dict[str, int | float] = {}
    heatmap: str = ""  # path of a heatmap JSON file ("" = none)
    predictor: str = ""  # path of a decode-length predictor JSON file ("" = none)
    jes: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    max_inflight_per_model: Annotated[int, msgspec.Meta(ge=1, le=10_000_000)] = 1_000_000
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=16)] = 3
    # a prefill TE whose KV failed to reach its decode TE gets no new task for this long (0: off)
    kv_fail_cooldown_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 5.0
    kv_events: bool = True  # the JEs mirror the TEs' KV cache events (False: routing guesses only)
    forwarding: Forwarding = msgspec.field(default_factory=Forwarding)
    migration: Migration = msgspec.field(default_factory=Migration)


def load_heatmap(path: str) -> dict[str, Any]:
    """The heatmap file as data, validated (errors name `scheduling.heatmap`)."""
    from deepserve.actors.scheduling import PdHeatmap

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        heat = data.get("heatmap", data) if isinstance(data, dict) else data
        return msgspec.to_builtins(msgspec.convert(heat, PdHeatmap))  # type: ignore[no-any-return]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ValueError(f"{path} is not a heatmap file: {exc}") from None


def load_predictor(path: str) -> dict[str, Any]:
    from deepserve.actors.scheduling.predictor import DecodeLengthTree

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        tree = data.get("predictor", data) if isinstance(data, dict) else data
        return msgspec.to_builtins(msgspec.convert(tree, DecodeLengthTree))  # type: ignore[no-any-return]
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, msgspec.ValidationError, ValueError) as exc:
        raise ValueError(f"{path} is not a predictor file: {exc}") from None


def check_scheduling(s: Any) -> list[tuple[str, str]]:
    """(key, problem) of a scenario's scheduling section; [] when absent or fine."""
    sch: Scheduling | None = s.scheduling
    if sch is None:
        return []
    from deepserve.actors.scheduling import Policy

    try:
        heat = load_heatmap(sch.heatmap) if sch.heatmap else None
    except ValueError as exc:
        return [("scheduling.heatmap", str(exc))]
    try:
        if sch.predictor:
            load_predictor(sch.predictor)
    except ValueError as exc:
        return [("scheduling.predictor", str(exc))]
    if sch.migration.kv and not sch.migration.enabled:
        return [("scheduling.migration.kv", "needs scheduling.migration.enabled = true")]
    if sch.migration.live and not sch.migration.kv:
        return [("scheduling.migration.live", "needs scheduling.migration.kv = true")]
    try:
        Policy(sch.policy, dict(sch.params), heat)
    except ValueError as exc:
        key, _, problem = str(exc).partition(": ")
        return [(key, problem)]
    return []
