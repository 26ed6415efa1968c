"""Asynchronous KV prefetch's cost model (DeepServe §4.2): is populating a cached prefix from
DRAM faster than recomputing it? Pure; the estimates come from the config and from the prefill
throughput the master measured on its own forwards."""

from __future__ import annotations

POPULATE_SETUP_S = 1e-4  # per copy: one DMA descriptor chain (assumption, order of PCIe latency)


def should_populate(
    dram_blocks: int, block_tokens: int, block_bytes: int, populate_bytes_per_s: float,
    prefill_tokens_per_s: float,
) -> bool:  # fmt: skip
    """True when moving the DRAM run into HBM costs less than recomputing its tokens."""
    if dram_blocks <= 0:
        return False
    load_s = POPULATE_SETUP_S + dram_blocks * block_bytes / populate_bytes_per_s
    recompute_s = dram_blocks * block_tokens / max(prefill_tokens_per_s, 1.0)
    return load_s < recompute_s
