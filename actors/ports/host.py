"""The host port: a server's DRAM page cache of model files, its SSD, and weight loading.

Loading a TE's weights (DeepServe §6.2) reads each TP rank's shard from the DRAM page cache (a
hit) or the SSD (a miss, which fills the cache), moves it to the rank's NPU, and initialises the
tensors. NPU-fork copies the shards from a running TE's NPUs instead, to one or many new TEs.
The host only moves bytes and keeps the cache; allocating the "weights" HBM region on the target
NPUs is the caller's business.

Shard sizes: without a layout (`tp` None) the targets are one TE's TP ranks and each gets
weights / len(targets) (sources for a fork). With a layout (`tp`, `dp`, `ep`, ...), each die
gets its expert-parallel shard — the attention slice plus its routed experts (memory.py:
`weights_per_npu_bytes`), as `deepserve hw predict` prices it — and the targets are the dies of
that layout this host loads (a DP32/EP32 TE spans two CloudMatrix384 servers: one load each).

Every load ends: `HostLoadDone`, or `HostLoadFailed` when a transfer fails, is dropped (the
fabric's mailbox was full) or is not answered within the host's load timeout.
"""

from __future__ import annotations

from deepserve.core.messages import Message


class HostLoad(Message, frozen=True, kw_only=True):
    """Load `model` onto `targets` (NPU addresses on this server): one TP rank each, or, with
    a layout, the dies of that layout this host loads, each its shard."""

    req_id: str
    model: str
    targets: tuple[str, ...]
    # The parallel layout the weights are sharded for (mirrors NpuForward's fields); None: the
    # targets are one TE's TP ranks and split the whole model evenly.
    tp: int | None = None
    dp: int = 1
    ep: int = 1
    shared_expert_ranks: int = 0
    redundant_experts: int = 0


class HostFork(Message, frozen=True, kw_only=True):
    """NPU-fork: rank r of the running TE (`sources[r]`) feeds rank r of every new TE.

    `targets` lists the new TEs' NPUs TE after TE (len(targets) == k * len(sources))."""

    req_id: str
    model: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    via: str | None = None  # "hccs", "roce", "ub"; None = the fabric's route
    tp: int | None = None  # the layout, as in HostLoad; None: the sources split the model evenly
    dp: int = 1
    ep: int = 1
    shared_expert_ranks: int = 0
    redundant_experts: int = 0


class HostLoadDone(Message, frozen=True, kw_only=True):
    req_id: str
    model: str
    # "ssd-shared": a miss that joined another load's in-flight SSD read of the file
    path: str  # "dram-hit", "ssd", "ssd-shared", "npu-fork-hccs", "npu-fork-roce", "npu-fork-ub"
    duration_s: float  # transfer + tensor initialisation
    bytes_per_npu: int
    targets: tuple[str, ...]


class HostLoadFailed(Message, frozen=True, kw_only=True):
    req_id: str
    model: str
    reason: str


class HostPreload(Message, frozen=True, kw_only=True):
    """Read a model file from SSD into the DRAM page cache (DRAM pre-loading, §6.2)."""

    req_id: str
    model: str


class HostPreloaded(Message, frozen=True, kw_only=True):
    req_id: str
    model: str
    hit: bool  # already cached: nothing was read
    duration_s: float
    evicted: tuple[str, ...]  # files the LRU cache dropped to make room


class HostEvict(Message, frozen=True, kw_only=True):
    req_id: str
    model: str


class HostEvicted(Message, frozen=True, kw_only=True):
    req_id: str
    model: str
    nbytes: int  # 0 when the file was not cached


class HostProbe(Message, frozen=True, kw_only=True):
    req_id: str


class HostStatus(Message, frozen=True, kw_only=True):
    req_id: str
    host: str
    cached: tuple[str, ...]  # least recently used first
    dram_bytes_used: int
    dram_bytes: int
    loads_in_flight: int
