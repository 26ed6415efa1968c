"""One TE's wiring: its configuration (shell and DP-group masters, as fs-engine's `TeConfig` and
`MasterConfig` dicts), its slot for the control plane, and its spawn in a driver.

Sizes come from the performance model (actors never import adapters, so the assembly hands them
in): a block's KV bytes on one NPU from the model's shape and TP, and the HBM block pool from the
NPU's HBM minus the reserve minus the weights (`adapters/hardware/memory.py`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.master.state import MasterConfig
from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.devices.topology import host_addr
from deepserve.adapters.hardware.memory import kv_bytes_per_token_per_npu, kv_capacity_tokens
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import npu_spec
from deepserve.adapters.scenario.placement import TePlacement
from deepserve.adapters.scenario.resilience import master_settings
from deepserve.adapters.scenario.schema import Cluster, Scenario


class KvSizing(msgspec.Struct, frozen=True):
    kv_block_bytes: int  # one block's KV on one NPU, all layers
    hbm_blocks: int  # blocks one DP group's HBM holds after weights and the reserve
    dram_blocks: int  # blocks of the group's DRAM tier (the group's TP ranks' KV, together)


def kv_sizing(c: Cluster, role: str = "colocated") -> KvSizing:
    m = model_profile(c.model)
    par = Parallel(tp=c.tp)
    block_bytes = int(kv_bytes_per_token_per_npu(m, par) * c.kv_block_tokens)
    blocks = kv_capacity_tokens(m, npu_spec(c.hardware), par) // c.kv_block_tokens
    s = c.scheduler
    if s.kv_blocks:
        blocks = min(blocks, s.kv_blocks)
    if role == "decode" and s.decode_kv_blocks:
        blocks = min(blocks, s.decode_kv_blocks)
    if blocks <= 0:
        raise ValueError(f"cluster.model: {c.model} leaves no HBM for KV on a {c.hardware} at tp={c.tp}")
    dram_blocks = int(c.kv_dram_gb * 1e9 // (block_bytes * c.tp))
    return KvSizing(block_bytes, blocks, dram_blocks)


def max_prompt_tokens(c: Cluster) -> tuple[int, str]:
    """The longest prompt every TE of the cluster takes, and what sets that limit. A master refuses
    a task whose prompt and first output token need more KV blocks than its DP group's HBM holds,
    or, chunked prefill off, more tokens than one pass takes (master/actor.py `_refusal`)."""
    roles = ("prefill", "decode") if c.mode == "pd" else ("colocated",)
    blocks = min(kv_sizing(c, role).hbm_blocks for role in roles)
    limit = blocks * c.kv_block_tokens - 1
    why = f"a DP group's KV cache holds {blocks} blocks of {c.kv_block_tokens} tokens, the first output token included"
    s = c.scheduler
    if not s.chunked_prefill and s.max_batch_tokens < limit:
        return s.max_batch_tokens, "cluster.scheduler.max_batch_tokens with chunked prefill off"
    return limit, why


def master_config(scenario: Scenario, te: TePlacement, dp: int) -> dict[str, Any]:
    """The DP-group master's configuration (fs-engine's `MasterConfig`, as a dict)."""
    c, s = scenario.cluster, scenario.cluster.scheduler
    size = kv_sizing(c, te.role)
    cfg: dict[str, Any] = {
        "model": c.model, "npus": te.npus[dp * c.tp:(dp + 1) * c.tp],
        "kv_block_bytes": size.kv_block_bytes, "hbm_blocks": size.hbm_blocks,
        "dram_blocks": size.dram_blocks,
        "block_tokens": c.kv_block_tokens, "host": host_addr(te.server), "role": te.role,
        "tp": c.tp, "max_num_seqs": s.max_running, "max_num_batched_tokens": s.max_batch_tokens,
        "chunked_prefill": s.chunked_prefill, "sched_gap_s": s.schedule_gap_ms / 1e3,
        "eos_rate": s.eos_rate, "aggregate": s.aggregate, "max_waiting": s.max_waiting,
        "te": te.addr, "dp": dp, "kv_ride": True,
        "eos_lognormal": (s.eos_lognormal_mu, s.eos_lognormal_sigma) if s.eos_model == "lognormal" else None,
    }  # fmt: skip
    # PD transfer settings, where the engine's MasterConfig has them (it grows additively).
    optional = {"kv_transfer": c.kv_transfer, "kv_layers": model_profile(c.model).n_layers,
                "token_ids": s.stream_token_ids}  # fmt: skip
    fields = set(MasterConfig.__struct_fields__)
    cfg.update({k: v for k, v in optional.items() if k in fields})
    cfg.update(master_settings(c.resilience, c.dp_groups, te.server))  # cluster.resilience: {} when all off
    return cfg


def te_config(scenario: Scenario, te: TePlacement) -> dict[str, Any]:
    """The TE shell's configuration (fs-engine's `TeConfig`, as a dict)."""
    c = scenario.cluster
    return {
        "te": te.addr, "role": te.role, "balancer": c.scheduler.balancer,
        "dps": [master_config(scenario, te, g) for g in range(c.dp_groups)],
    }  # fmt: skip


def spawn_te(driver: Any, scenario: Scenario, te: TePlacement) -> str:
    """One TE: its shell, which spawns its DP-group masters (fs-engine's actors)."""
    from deepserve.actors.flowserve.te_shell import TeShell

    return driver.spawn(te.addr, TeShell, config=te_config(scenario, te))  # type: ignore[no-any-return]


def te_slot(scenario: Scenario, te: TePlacement) -> TeSlot:
    """The TE's slot: what the cluster manager hands the pod launcher to boot (and re-boot) it."""
    c = scenario.cluster
    return TeSlot(te=te.addr, group=f"{c.model}/{te.role}", model=c.model, role=te.role,  # type: ignore[arg-type]
                  server=te.server, host=host_addr(te.server), npus=te.npus, tp=c.tp, dp_groups=c.dp_groups,
                  te_config=te_config(scenario, te))  # fmt: skip
