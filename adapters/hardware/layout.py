"""Where a layout's ranks sit, which links its collectives cross, and the layouts the hardware
cannot hold.

Ranks are placed server-major, the way a TE is packed onto servers (DeepServe §6: a TE spans one
or more servers): a TP group of up to one server's NPUs stays inside the server, DP groups fill
servers one after another, EP ranks are the DP x TP attention ranks (xDeepServe §7.1). A
collective whose ranks stay in one server runs on the server's intra link (HCCS on Gen1, UB on
CloudMatrix384); one that spans servers also crosses the inter-server link (RoCE on Gen1, UB
within a SuperPod). Refusals name the limit and where it comes from.
"""

from __future__ import annotations

import functools
import math

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel, check_experts
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.specs import (
    ClusterSpec,
    LinkSpec,
    NpuSpec,
    ServerSpec,
    cluster_spec,
    link_spec,
    server_spec,
)

# The cluster a die kind runs in when none is named: 910B servers form a Gen1 cluster,
# 910C dies a CloudMatrix384 SuperPod (DeepServe §2).
DEFAULT_CLUSTER = {"910b": "gen1", "910c": "cm384"}

# Where each cluster's size limit comes from, for the refusal message.
_CLUSTER_SOURCE = {
    "gen1": "8 NPUs per server: DeepServe §2; 8 servers: assumption in specs.CLUSTERS, "
    "raise with --servers",
    "cm384": "48 servers x 8 chips x 2 dies: DeepServe §2, xDeepServe §2.2",
}


class Span(Struct, frozen=True, kw_only=True):
    """The links a layout's collectives may cross: `intra` inside one server of `server_npus`
    NPUs, `inter` between servers of the same scale-up domain or cluster."""

    intra: LinkSpec
    inter: LinkSpec
    server_npus: int

    @classmethod
    def single(cls, link: LinkSpec) -> Span:
        """Every collective on one link (what an explicit `link=` override means)."""
        return cls(intra=link, inter=link, server_npus=1 << 30)


def span_for(npu: NpuSpec) -> Span:
    """The links of the NPU's default server: HCCS in a Gen1 server and RoCE between servers;
    UB everywhere in a CloudMatrix384 (DeepServe §2, xDeepServe §2.2)."""
    server = server_spec(npu.default_server)
    return Span(
        intra=link_spec(server.intra_link),
        inter=link_spec(server.inter_link),
        server_npus=server.npus,
    )


def servers_spanned(ranks: int, span: Span) -> int:
    """Servers a group of `ranks` consecutive ranks occupies (placed from a server boundary)."""
    return max(1, math.ceil(ranks / span.server_npus))


def group_link(ranks: int, span: Span) -> LinkSpec:
    """The bottleneck link of a collective among `ranks` consecutive ranks: the intra link if
    they share a server, else the inter-server link."""
    return span.intra if ranks <= span.server_npus else span.inter


def peers_split(ranks: int, span: Span) -> tuple[int, int]:
    """(peers in the same server, peers in other servers) of one rank of an all-to-all."""
    local = min(ranks, span.server_npus) - 1
    return local, ranks - 1 - local


class Cluster(Struct, frozen=True, kw_only=True):
    """A cluster as the refusals see it: `servers` servers of `server` (default: the spec's)."""

    spec: ClusterSpec
    server: ServerSpec
    servers: int

    @property
    def npus(self) -> int:
        return self.servers * self.server.npus


def cluster_for(npu: NpuSpec, cluster: str | None = None, servers: int | None = None) -> Cluster:
    """The cluster `npu` runs in (its default one unless named), optionally with fewer/more
    servers (bounded by the cluster's physical maximum)."""
    spec = cluster_spec(cluster or DEFAULT_CLUSTER[npu.kind])
    server = server_spec(spec.server)
    if server.npu != npu.kind:
        raise ValueError(
            f"cluster: a {spec.kind} cluster is built of {server.npu} NPUs, not {npu.kind}"
        )
    n = spec.servers if servers is None else servers
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= spec.max_servers:
        raise ValueError(
            f"servers: a {spec.kind} cluster has 1 to {spec.max_servers} servers, got {n!r}"
        )
    return Cluster(spec=spec, server=server, servers=n)


@functools.lru_cache(maxsize=8)
def largest_cluster(npu: NpuSpec) -> Cluster:
    """The largest cluster of the NPU's kind (its default cluster at `max_servers`)."""
    spec = cluster_spec(DEFAULT_CLUSTER[npu.kind])
    return cluster_for(npu, spec.kind, spec.max_servers)


def check_layout(m: ModelProfile, par: Parallel, cluster: Cluster) -> None:
    """Refuse a layout the cluster cannot hold or the model cannot fill (ValueError naming the
    field, the limit and its source)."""
    need = par.dp * par.tp * par.pp
    if need > cluster.npus:
        unit = "dies" if cluster.server.chips != cluster.server.npus else "NPUs"
        raise ValueError(
            f"dp: DP{par.dp} x TP{par.tp} x PP{par.pp} = {need} NPUs exceeds the {cluster.npus} "
            f"{cluster.server.npu} {unit} of the {cluster.spec.kind} cluster, {cluster.servers} "
            f"servers x {cluster.server.npus} ({_CLUSTER_SOURCE[cluster.spec.kind]})"
        )
    check_experts(m, par)


def check_scale_up_domain(link: LinkSpec, npus: int, cluster: Cluster, what: str) -> None:
    """`npus` NPUs exchanging data over `link` must all sit in one domain of that link: HCCS
    does not leave a Gen1 server (DeepServe §2, P/D-Serve §3.7), RoCE joins the Gen1 servers
    (DeepServe §2), UB spans the SuperPod (xDeepServe §2.2), whose RoCE plane leads to other
    SuperPods and 910B servers, not between its own dies."""
    server = cluster.server
    kinds = sorted({server.intra_link, server.inter_link})
    if link.kind not in kinds:
        raise ValueError(
            f"{what}: a {cluster.spec.kind} cluster has no {link.kind} link between its NPUs (it "
            f"has {', '.join(kinds)}; DeepServe §2, xDeepServe §2.2)"
        )
    if link.kind == server.inter_link:
        domain, where = cluster.npus, f"the {cluster.npus} NPUs of the cluster"
    else:
        domain = server.npus * cluster.spec.scale_up_servers
        where = f"one {link.kind} domain of {domain} NPUs (one {server.kind} server, DeepServe §2)"
    if npus > domain:
        raise ValueError(f"{what}: {npus} NPUs over {link.kind} exceed {where}")
