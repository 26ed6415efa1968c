"""Wiring for the FlowServe tests: emulated hardware + DP masters / TE shells + a requester."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve.messages import Prompt, Sampling, SubmitTask
from deepserve.actors.flowserve.tokens import unique_chain_hashes
from deepserve.adapters.hardware.devices.topology import gen1_cluster, spawn_topology
from deepserve.core import SimDriver

REQ = "ext/req"  # the requester: everything a TE sends back lands here
MODEL = "llama3-8b"
# llama3-8b KV per token: 32 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 bytes = 128 KiB
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


def hardware(d: SimDriver, servers: int = 1, variance: bool = False) -> None:
    spawn_topology(d, gen1_cluster(servers), variance=variance)


def master_config(**kw: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = dict(
        model=MODEL, npus=("hw/s0/npu0",), kv_block_bytes=KV_BYTES_PER_TOKEN * 128,
        hbm_blocks=2000, block_tokens=128, te="te/0", dp=0,
    )  # fmt: skip
    cfg.update(kw)
    return cfg


def task(i: int, prompt_tokens: int, out: int, *, kind: str = "chat", hashes: tuple[int, ...] | None = None,
         max_tokens: int = 4096, block: int = 128, **kw: Any) -> SubmitTask:  # fmt: skip
    h = unique_chain_hashes(i, prompt_tokens, block) if hashes is None else hashes
    kw.setdefault("reply_to", REQ)
    return SubmitTask(
        task_id=f"t{i}", request_id=f"r{i}", kind=kind, model=MODEL,  # type: ignore[arg-type]
        prompt=Prompt(num_tokens=prompt_tokens, block_hashes=h),
        sampling=Sampling(max_tokens=max_tokens, target_output_tokens=out, seed=i), **kw,
    )  # fmt: skip
