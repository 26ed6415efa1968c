"""Weight-loading time for TE-Load (DeepServe §6.2, Fig. 10, Fig. 11).

Local loading: SSD -> DRAM page cache -> NPU over the host link, one flow per TP rank; the
server's host side is shared, so ranks loading at once slow each other down (max-min fair
sharing). A page-cache hit skips the SSD. NPU-fork: a running TE sends each rank's shard to the
new TE over the scale-up (HCCS/UB) or scale-out (RoCE) link; broadcast feeds many new TEs at once.
Every path ends with PyTorch tensor initialisation (~0.3 s, DeepServe §6.2).
"""

from __future__ import annotations

from msgspec import Struct

from deepserve.adapters.hardware.fairshare import Flow, completion_times_s
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import LinkSpec, ServerSpec, link_spec
from deepserve.adapters.hardware.transfer import (
    BROADCAST_CHUNK_BYTES,
    broadcast_time_s,
    effective_bw_bytes_per_s,
)

TENSOR_INIT_S = 0.3  # DeepServe §6.2: "PyTorch-model tensor initialization (about 0.3s)"


class LoadEstimate(Struct, frozen=True, kw_only=True):
    path: str
    seconds: float
    bytes_per_npu: int
    transfer_s: float  # seconds spent moving bytes (seconds minus tensor initialisation)


def _check_tp(tp: int, server: ServerSpec) -> None:
    if not 1 <= tp <= server.npus:
        raise ValueError(
            f"tp: must be between 1 and the {server.npus} NPUs of {server.kind}, got {tp}"
        )


def local_load(
    m: ModelProfile, server: ServerSpec, tp: int, *, dram_hit: bool, loaders: int | None = None,
    bytes_per_npu: int | None = None,
) -> LoadEstimate:  # fmt: skip
    """Load a TP-`tp` TE from this server's DRAM page cache (hit) or SSD (miss).

    `loaders` NPUs of the server load at once (default: the TE's tp ranks); the SSD and the
    host side are shared by all of them, each NPU has its own host link."""
    _check_tp(tp, server)
    loaders = tp if loaders is None else loaders
    _check_tp(loaders, server)
    # An EP layout's shards are not weights / tp: the caller passes the real shard size.
    per_npu = weight_bytes(m) // tp if bytes_per_npu is None else bytes_per_npu
    host = link_spec(server.host_link)
    capacities = {"host": server.host_aggregate_bw_bytes_per_s}
    if not dram_hit:
        capacities["ssd"] = server.ssd_read_bw_bytes_per_s
    flows = {}
    for i in range(loaders):
        capacities[f"npu{i}"] = effective_bw_bytes_per_s(host)
        path = ("host", f"npu{i}") if dram_hit else ("ssd", "host", f"npu{i}")
        flows[f"npu{i}"] = Flow(path=path, nbytes=per_npu)
    done = completion_times_s(capacities, flows)
    # One setup and one message, as `transfer_time_s` charges any single transfer.
    transfer = host.latency_s + host.per_message_s + max(done.values())
    return LoadEstimate(
        path="dram-hit" if dram_hit else "ssd",
        seconds=transfer + TENSOR_INIT_S,
        bytes_per_npu=per_npu,
        transfer_s=transfer,
    )


def npu_fork(
    m: ModelProfile, link: LinkSpec, tp: int, *, targets: int = 1,
    chunk_bytes: int = BROADCAST_CHUNK_BYTES, bytes_per_npu: int | None = None,
) -> LoadEstimate:  # fmt: skip
    """Copy a running TE's weights to `targets` new TEs of the same layout (DeepServe §6.2).

    Each rank's shard moves over its own link (no sharing between ranks: NPU-fork uses separate
    physical links, §6.2), chunked and pipelined through the targets as an HCCL broadcast."""
    if tp < 1:
        raise ValueError(f"tp: must be >= 1, got {tp}")
    per_npu = weight_bytes(m) // tp if bytes_per_npu is None else bytes_per_npu
    transfer = broadcast_time_s(per_npu, link, targets, chunk_bytes=chunk_bytes)
    return LoadEstimate(
        path=f"npu-fork-{link.kind}",
        seconds=transfer + TENSOR_INIT_S,
        bytes_per_npu=per_npu,
        transfer_s=transfer,
    )


def theoretical_dram_load_s(m: ModelProfile, server: ServerSpec, tp: int) -> float:
    """DeepServe Fig. 10's "DRAM-theoretical": a rank's weights over nominal host-link bandwidth."""
    _check_tp(tp, server)
    return weight_bytes(m) / tp / link_spec(server.host_link).bw_bytes_per_s


def dram_cached_models(m: ModelProfile, server: ServerSpec) -> int:
    """How many copies of the model's weights the server's DRAM page cache holds (§6.2)."""
    return server.dram_bytes // weight_bytes(m)
