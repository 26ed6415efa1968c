"""Transfer cost over links: one link, multi-hop paths, UB semantics, collectives, broadcast.

The cost of a transfer is setup latency + a control cost per message + bytes / bandwidth. The
per-message term is why DistFlow moves KV contiguously (DeepServe §4.4): many small block-by-block
messages cost more than one contiguous transfer of the same bytes. Concurrent transfers that share
a link are handled by fairshare.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from deepserve.adapters.hardware.specs import UB, LinkSpec, UbSpec

# HCCL pipelines a broadcast in chunks; assumption: 4 MiB, a typical collective chunk size.
BROADCAST_CHUNK_BYTES = 4 * 1024 * 1024


def _check_bytes(nbytes: float) -> None:
    if nbytes < 0:
        raise ValueError(f"nbytes: must be >= 0, got {nbytes}")


def effective_bw_bytes_per_s(link: LinkSpec) -> float:
    return link.bw_bytes_per_s * link.eff


def transfer_time_s(nbytes: float, link: LinkSpec, *, messages: int = 1) -> float:
    """One transfer of nbytes split into `messages` messages over one link."""
    _check_bytes(nbytes)
    if messages < 1:
        raise ValueError(f"messages: must be >= 1, got {messages}")
    return link.latency_s + messages * link.per_message_s + nbytes / effective_bw_bytes_per_s(link)


def blockwise_transfer_time_s(nbytes: float, block_bytes: int, link: LinkSpec) -> float:
    """The same bytes sent one block per message (paged KV without contiguous transfer)."""
    if block_bytes <= 0:
        raise ValueError(f"block_bytes: must be > 0, got {block_bytes}")
    return transfer_time_s(nbytes, link, messages=max(1, math.ceil(nbytes / block_bytes)))


def path_bw_bytes_per_s(path: Sequence[LinkSpec]) -> float:
    """A multi-hop path runs at its bottleneck hop's effective bandwidth."""
    if not path:
        raise ValueError("path: must have at least one link")
    return min(effective_bw_bytes_per_s(link) for link in path)


def path_time_s(nbytes: float, path: Sequence[LinkSpec], *, messages: int = 1) -> float:
    """Store-and-forward-free (pipelined) multi-hop transfer: the latencies and per-message
    costs of every hop add up, the bytes stream at the bottleneck bandwidth."""
    _check_bytes(nbytes)
    if messages < 1:
        raise ValueError(f"messages: must be >= 1, got {messages}")
    bw = path_bw_bytes_per_s(path)
    fixed = sum(link.latency_s + messages * link.per_message_s for link in path)
    return fixed + nbytes / bw


def allreduce_time_s(nbytes: float, ranks: int, link: LinkSpec) -> float:
    """All-reduce of nbytes per rank (TP collectives over HCCS/UB).

    Reduce-scatter + all-gather move 2(p-1)/p of the data through each rank; on a full mesh
    (HCCS) a rank drives up to `ports` links at once, on a switched fabric (UB) its one port.
    Two latency rounds: a mesh/switch reaches every peer in one step per phase."""
    _check_bytes(nbytes)
    if ranks < 1:
        raise ValueError(f"ranks: must be >= 1, got {ranks}")
    if ranks == 1:
        return 0.0
    bw = effective_bw_bytes_per_s(link) * min(link.ports, ranks - 1)
    return 2 * (link.latency_s + link.per_message_s) + 2 * (ranks - 1) / ranks * nbytes / bw


def broadcast_time_s(
    nbytes: float, link: LinkSpec, targets: int, *, chunk_bytes: int = BROADCAST_CHUNK_BYTES
) -> float:
    """Pipelined chain broadcast (HCCL broadcast, DeepServe Fig. 11): each target forwards
    chunks to the next, so n targets cost (chunks + n - 1) chunk-times, not n transfers."""
    _check_bytes(nbytes)
    if targets < 1:
        raise ValueError(f"targets: must be >= 1, got {targets}")
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes: must be > 0, got {chunk_bytes}")
    chunks = max(1, math.ceil(nbytes / chunk_bytes))
    lag_bytes = (targets - 1) * min(nbytes, chunk_bytes)  # the last target is n-1 chunks behind
    streamed = (nbytes + lag_bytes) / effective_bw_bytes_per_s(link)
    return targets * link.latency_s + (chunks + targets - 1) * link.per_message_s + streamed


def ub_send_time_s(
    nbytes: float,
    cores: int,
    link: LinkSpec,
    *,
    semantic: Literal["memory", "dma"] = "memory",
    ub: UbSpec = UB,
) -> float:
    """XCCL send/recv between two dies over UB (xDeepServe §3.1).

    Memory semantics: computing cores copy through their data buffers (ping-pong), low latency,
    bandwidth grows with cores until the link saturates. DMA: higher start latency, but the link
    bandwidth without using cores, and transfers up to GBs (§2.2, §3.3)."""
    _check_bytes(nbytes)
    if cores < 1:
        raise ValueError(f"cores: must be >= 1, got {cores}")
    link_bw = effective_bw_bytes_per_s(link)
    if semantic == "dma":
        return ub.dma_latency_s + link.per_message_s + nbytes / link_bw
    if semantic != "memory":
        raise ValueError(f"semantic: must be 'memory' or 'dma', got {semantic!r}")
    bw = min(link_bw, cores * ub.per_core_bw_bytes_per_s)
    return ub.memory_latency_s + link.per_message_s + nbytes / bw


def ub_best_send_time_s(nbytes: float, cores: int, link: LinkSpec, *, ub: UbSpec = UB) -> float:
    """What XCCL achieves choosing the cheaper semantic for the size."""
    return min(
        ub_send_time_s(nbytes, cores, link, semantic="memory", ub=ub),
        ub_send_time_s(nbytes, cores, link, semantic="dma", ub=ub),
    )
