"""The JE's migration cost figures (actors/je/migration.py) from the performance model of the
cluster's model, NPU and link (docs/perf-model.md): the whole model's KV bytes of one token,
the link's effective rate, and one TE's prefill throughput (one 2,048-token prefill pass)."""

from __future__ import annotations

from typing import Any

from deepserve.adapters.hardware.batch import Batch, Parallel, Seq
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.sizes import kv_bytes_per_token
from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s
from deepserve.adapters.scenario.schema import Cluster

PROBE_TOKENS = 2048  # the prefill pass the throughput is read from


def migration_config(c: Cluster, enabled: bool, max_migrations: int) -> dict[str, Any]:
    """`JeConfig.migration` as data: the switch and the cluster's cost figures."""
    m = model_profile(c.model)
    par = Parallel(tp=c.tp)
    pass_s = forward_time(m, npu_spec(c.hardware), Batch(seqs=(Seq(new_tokens=PROBE_TOKENS),)), par).total_s
    return {
        "enabled": enabled, "max_migrations": max_migrations,
        "kv_bytes_per_token": float(kv_bytes_per_token(m)),
        "link_bytes_per_s": effective_bw_bytes_per_s(link_spec(c.link)),
        "prefill_tokens_per_s": PROBE_TOKENS / pass_s,
    }  # fmt: skip


def kv_migration_config(c: Cluster) -> dict[str, Any]:
    """`MigrationParams.kv` on, with the rate KV leaves a host's DRAM at (its host link: PCIe on
    gen1, UB on a CloudMatrix; the path's slower side with the network link)."""
    from deepserve.adapters.hardware.devices.topology import build

    kind = build(c.topology, 1).server_kind
    return {"kv": True, "host_bytes_per_s": effective_bw_bytes_per_s(link_spec(server_spec(kind).host_link))}
