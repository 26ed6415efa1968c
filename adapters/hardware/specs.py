"""Hardware spec tables: NPUs, links, servers and clusters of the two Ascend generations.

Every number cites its source here and in docs/hardware.md: a seed paper's section (DeepServe,
xDeepServe), a public vendor/paper figure (named), or "assumption" with the reason. Efficiency
factors come from calibration.py, the one place where numbers are fitted to measurements.
"""

from __future__ import annotations

from msgspec import Struct

from deepserve.adapters.hardware.calibration import (
    DAVINCI_EFFICIENCY,
    HCCS_EFFICIENCY,
    PCIE_EFFICIENCY,
    ROCE_EFFICIENCY,
    UB_EFFICIENCY,
    UB_PER_PEER_S,
    VPC_EFFICIENCY,
    Efficiency,
)
from deepserve.adapters.hardware.errors import UnknownNameError

GB = 10**9
TB = 10**12


class NpuSpec(Struct, frozen=True, kw_only=True):
    """One accelerator unit that runs a TP/DP rank: a 910B chip, or one die of a 910C chip."""

    kind: str
    tflops_fp16: float
    tops_int8: float
    hbm_bytes: int
    hbm_bw_bytes_per_s: float
    compute_cores: int  # cores a communication kernel can use (xDeepServe §3.1)
    dies_per_chip: int
    scale_up_link: str  # link kind for TP collectives, EP all-to-all, NPU-fork within the domain
    scale_out_link: str
    default_server: str
    eff: Efficiency


class LinkSpec(Struct, frozen=True, kw_only=True):
    """A link as seen by one endpoint: unidirectional bandwidth and the costs per transfer."""

    kind: str
    bw_bytes_per_s: float  # per endpoint (per peer link for a full mesh), unidirectional
    latency_s: float  # setup latency of one transfer
    per_message_s: float  # control cost of each message (descriptor, doorbell, completion)
    eff: float  # fraction of bw_bytes_per_s a bulk transfer reaches
    ports: int = 1  # peers reachable at full bandwidth at once (7 in an 8-NPU full mesh)


class UbSpec(Struct, frozen=True, kw_only=True):
    """The two ways to move data over UB (xDeepServe §2.2, §3.1, §3.3)."""

    memory_latency_s: float  # memory-semantic (mtu-in/mtu-out) send/recv protocol latency
    per_core_bw_bytes_per_s: float  # what one computing core's ping-pong buffer sustains
    buffer_bytes: int  # a core's data buffer: memory-semantic chunks are at most this big
    dma_latency_s: float  # DMA (NPU-Direct URMA) start latency: higher, but bulk and core-free


class ServerSpec(Struct, frozen=True, kw_only=True):
    kind: str
    npu: str
    npus: int  # NPU units (910B chips, or 910C dies) per server
    chips: int
    dram_bytes: int
    ssd_read_bw_bytes_per_s: float
    host_link: str  # host DRAM <-> NPU link kind (one per NPU)
    host_aggregate_bw_bytes_per_s: float  # host side shared by all the server's NPUs
    intra_link: str  # NPU <-> NPU within the server
    inter_link: str  # NPU <-> NPU across servers
    external_link: str  # traffic to/from outside the cluster


class ClusterSpec(Struct, frozen=True, kw_only=True):
    kind: str
    server: str
    servers: int
    scale_up_servers: int  # servers in one scale-up domain
    max_servers: int  # the most servers one cluster of this kind can have
    global_shared_memory: bool  # any die reads/writes any die's HBM and any CPU's DRAM


NPUS: dict[str, NpuSpec] = {
    "910b": NpuSpec(
        kind="910b",
        tflops_fp16=400e12,  # DeepServe §2
        tops_int8=800e12,  # 2x FP16: DaVinci cube ratio, Huawei Ascend 910 spec 256 TF / 512 TOPS
        hbm_bytes=64 * GB,  # DeepServe §2
        hbm_bw_bytes_per_s=1.6 * TB,  # one 910C die's share of 3.2 TB/s (Zuo et al. 2025)
        compute_cores=48,  # assumption: same die as a 910C die (xDeepServe §3.1: 48 per die)
        dies_per_chip=1,
        scale_up_link="hccs",
        scale_out_link="roce",
        default_server="gen1-910b",
        eff=DAVINCI_EFFICIENCY,
    ),
    "910c": NpuSpec(  # one die; a 910C chip is two of these (DeepServe §2, xDeepServe §2.2)
        kind="910c",
        tflops_fp16=400e12,  # DeepServe §2: each die 400 TFLOPS
        tops_int8=800e12,  # 2x FP16, as for 910B
        hbm_bytes=64 * GB,  # DeepServe §2: each die 64 GB
        hbm_bw_bytes_per_s=1.6 * TB,  # Zuo et al. 2025 (CloudMatrix384): 3.2 TB/s per chip
        compute_cores=48,  # xDeepServe §3.1: up to 48 computing cores per die
        dies_per_chip=2,
        scale_up_link="ub",
        scale_out_link="roce",
        default_server="cm384-910c",
        eff=DAVINCI_EFFICIENCY,
    ),
}

LINKS: dict[str, LinkSpec] = {
    # UB: 392 GB/s unidirectional per 910C chip (Zuo et al. 2025) = 196 GB/s per die; DeepServe §2
    # "around 200 GB/s", xDeepServe §5 "400 GB/s scale-up". Uniform across the SuperPod
    # (xDeepServe §2.2). Latency: assumption, sub-us hops + kernel start ("us-level", §3.1).
    "ub": LinkSpec(
        kind="ub",
        bw_bytes_per_s=196 * GB,
        latency_s=2e-6,
        per_message_s=UB_PER_PEER_S,
        eff=UB_EFFICIENCY,
    ),
    # HCCS full mesh inside a Gen1 server: assumption 56 GB/s per peer link, 7 peers (the widely
    # quoted 392 GB/s per 910B); Ascend 910 (2019) had 3 x 240 Gbps ports. Latency: assumption.
    "hccs": LinkSpec(
        kind="hccs",
        bw_bytes_per_s=56 * GB,
        latency_s=10e-6,
        per_message_s=5e-6,
        eff=HCCS_EFFICIENCY,
        ports=7,
    ),
    # RoCE: 200 Gbps per NPU to a ToR switch (DeepServe §2). Latency/per-message: assumption for
    # an HCCL point-to-point operation (RDMA handshake + completion polling).
    "roce": LinkSpec(
        kind="roce",
        bw_bytes_per_s=25 * GB,
        latency_s=20e-6,
        per_message_s=10e-6,
        eff=ROCE_EFFICIENCY,
    ),
    # PCIe 4.0 x16 host<->NPU: Huawei Ascend 910 spec (Hot Chips 2019); assumption: unchanged on
    # 910B. ~31.5 GB/s usable per direction. Latency/per-message: assumption (DMA descriptor).
    "pcie": LinkSpec(
        kind="pcie",
        bw_bytes_per_s=32 * GB,
        latency_s=10e-6,
        per_message_s=5e-6,
        eff=PCIE_EFFICIENCY,
    ),
    # VPC: outside traffic (DeepServe §2 Fig. 1, xDeepServe §2.2). Assumption: 25 Gbps per server.
    "vpc": LinkSpec(
        kind="vpc",
        bw_bytes_per_s=3.125 * GB,
        latency_s=50e-6,
        per_message_s=20e-6,
        eff=VPC_EFFICIENCY,
    ),
}

UB = UbSpec(
    memory_latency_s=2e-6,  # assumption, consistent with xDeepServe §3.1 (<20 us for <1 MB)
    per_core_bw_bytes_per_s=32 * GB,  # fitted to §3.1: <20 us for 1 MB on 2 cores, 9 MB >2.5x
    buffer_bytes=256 * 1024,  # xDeepServe §2.2: "buffer size of hundreds of KBs"
    dma_latency_s=8e-6,  # assumption: "higher starting latency" than memory semantics (§3.1)
)

SERVERS: dict[str, ServerSpec] = {
    "gen1-910b": ServerSpec(
        kind="gen1-910b",
        npu="910b",
        npus=8,  # DeepServe §2
        chips=8,
        dram_bytes=1_500 * GB,  # DeepServe §6.2: 1.5 TB per machine
        ssd_read_bw_bytes_per_s=6 * GB,  # assumption: one PCIe 4.0 NVMe drive, sequential read
        host_link="pcie",  # DeepServe §6.2
        host_aggregate_bw_bytes_per_s=64 * GB,  # assumption: contention beyond two loaders (§6.2)
        intra_link="hccs",  # DeepServe §6.2
        inter_link="roce",  # DeepServe §2
        external_link="vpc",
    ),
    "cm384-910c": ServerSpec(
        kind="cm384-910c",
        npu="910c",
        npus=16,  # 8 chips x 2 dies (DeepServe §2, xDeepServe §2.2)
        chips=8,
        dram_bytes=1_500 * GB,  # assumption: as Gen1 (no published per-server figure used)
        ssd_read_bw_bytes_per_s=6 * GB,  # assumption, as Gen1
        host_link="ub",  # CPUs sit on the UB fabric (xDeepServe §2.2)
        host_aggregate_bw_bytes_per_s=640 * GB,  # Zuo et al. 2025: 4 CPUs x ~160 GB/s UB each
        intra_link="ub",
        inter_link="ub",  # uniform UB across the SuperPod (xDeepServe §2.2)
        external_link="vpc",
    ),
}

CLUSTERS: dict[str, ClusterSpec] = {
    "gen1": ClusterSpec(
        kind="gen1",
        server="gen1-910b",
        servers=8,  # assumption: a small scaled-out cluster; the size is a config choice
        scale_up_servers=1,  # HCCS does not leave the server
        # P/D-Serve §2, §3.7: a region holds thousands of NPUs (RoCE IPs per region "in
        # thousands"); 1024 servers = 8,192 NPUs. Assumption within that bound.
        max_servers=1024,
        global_shared_memory=False,
    ),
    "cm384": ClusterSpec(
        kind="cm384",
        server="cm384-910c",
        servers=48,  # DeepServe §2, xDeepServe §2.2: 48 servers, 384 chips, 768 dies
        scale_up_servers=48,
        max_servers=48,  # one SuperPod (DeepServe §2)
        global_shared_memory=True,  # DeepServe §2, xDeepServe §2.2
    ),
}


def npu_spec(kind: str) -> NpuSpec:
    if kind not in NPUS:
        raise UnknownNameError("npu", kind, NPUS)
    return NPUS[kind]


def link_spec(kind: str) -> LinkSpec:
    if kind not in LINKS:
        raise UnknownNameError("link", kind, LINKS)
    return LINKS[kind]


def server_spec(kind: str) -> ServerSpec:
    if kind not in SERVERS:
        raise UnknownNameError("server", kind, SERVERS)
    return SERVERS[kind]


def cluster_spec(kind: str) -> ClusterSpec:
    if kind not in CLUSTERS:
        raise UnknownNameError("cluster", kind, CLUSTERS)
    return CLUSTERS[kind]


def cluster_npus(cluster: ClusterSpec) -> int:
    """NPU units (910B chips or 910C dies) in a cluster."""
    return cluster.servers * server_spec(cluster.server).npus


def cluster_chips(cluster: ClusterSpec) -> int:
    return cluster.servers * server_spec(cluster.server).chips
