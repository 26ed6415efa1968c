"""Topologies: which devices and links a cluster has, how bytes are routed, and spawning it all.

Pure descriptions first (`gen1_cluster`, `cloudmatrix384`), then `spawn_topology` to start the
actors in a driver. Addresses:

    hw/fabric           one fabric actor owns every link of the cluster (one place computes
                        max-min sharing over multi-hop paths)
    hw/s{i}/host        server i's host: DRAM page cache, SSD, weight loading
    hw/s{i}/npu{j}      NPU unit j of server i (a 910B chip, or one die of a 910C chip)
    hw/s{i}/ssd         an endpoint only (no actor): transfers may start there

A link is named without the "hw/" prefix ("s0/npu3/roce", "s0/hccs/2-5", "s0/host/pcie",
"s0/ssd") and has one or two directions; a direction ("s0/npu3/roce:tx") is the unit of
bandwidth sharing, a link is the unit of faults (down takes both directions).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import Any

import msgspec

from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec
from deepserve.adapters.hardware.transfer import effective_bw_bytes_per_s

FABRIC = "hw/fabric"
HOST_SIDE = "host"  # link kind of a server's shared host side (DRAM / root complex)
SSD = "ssd"  # link kind of a server's SSD read bandwidth
_ENDPOINT = re.compile(r"^hw/s(\d+)/(?:npu(\d+)|(host)|(ssd))$")


class LinkDesc(msgspec.Struct, frozen=True):
    name: str
    kind: str  # a specs.LINKS kind, or HOST_SIDE / SSD
    directions: tuple[str, ...]
    capacity_bytes_per_s: float  # per direction, what a bulk transfer reaches


class Route(msgspec.Struct, frozen=True):
    resources: tuple[str, ...]  # link directions crossed, "link:dir"
    link_kind: str  # the link that sets the transfer's fixed costs (latency, per message)


class Topology(msgspec.Struct, frozen=True):
    cluster: str  # "gen1" or "cm384"
    servers: int
    server_kind: str
    npu_kind: str
    npus_per_server: int
    links: tuple[LinkDesc, ...]

    def npus(self) -> list[str]:
        return [npu_addr(s, j) for s in range(self.servers) for j in range(self.npus_per_server)]

    def hosts(self) -> list[str]:
        return [host_addr(s) for s in range(self.servers)]


def npu_addr(server: int, index: int) -> str:
    return f"hw/s{server}/npu{index}"


def host_addr(server: int) -> str:
    return f"hw/s{server}/host"


def ssd_addr(server: int) -> str:
    return f"hw/s{server}/ssd"


def _link(name: str, kind: str, directions: tuple[str, ...], capacity: float) -> LinkDesc:
    return LinkDesc(name, kind, directions, capacity)


def _host_links(s: int, server_kind: str) -> list[LinkDesc]:
    spec = server_spec(server_kind)
    host_side = f"s{s}/host/{spec.host_link}"
    return [
        _link(host_side, HOST_SIDE, ("h2d", "d2h"), spec.host_aggregate_bw_bytes_per_s),
        _link(f"s{s}/ssd", SSD, ("rd",), spec.ssd_read_bw_bytes_per_s),
    ]


def _check_servers(servers: int, limit: int, cluster: str) -> None:
    if not 1 <= servers <= limit:
        raise ValueError(f"servers: {cluster} takes 1 to {limit} servers, got {servers}")


@functools.lru_cache(maxsize=16)
def gen1_cluster(servers: int = 1) -> Topology:
    """Gen1 Ascend servers: 8 x 910B, an HCCS full mesh inside a server, one 200 Gbps RoCE NIC
    per NPU to a non-blocking ToR (assumption), PCIe from host DRAM to each NPU."""
    _check_servers(servers, 1024, "gen1")
    kind = "gen1-910b"
    spec = server_spec(kind)
    hccs = effective_bw_bytes_per_s(link_spec("hccs"))
    roce = effective_bw_bytes_per_s(link_spec("roce"))
    pcie = effective_bw_bytes_per_s(link_spec(spec.host_link))
    links: list[LinkDesc] = []
    for s in range(servers):
        for i in range(spec.npus):
            links.append(_link(f"s{s}/npu{i}/roce", "roce", ("tx", "rx"), roce))
            links.append(_link(f"s{s}/npu{i}/pcie", "pcie", ("h2d", "d2h"), pcie))
            for j in range(i + 1, spec.npus):
                links.append(_link(f"s{s}/hccs/{i}-{j}", "hccs", (f"{i}>{j}", f"{j}>{i}"), hccs))
        links.extend(_host_links(s, kind))
    return Topology("gen1", servers, kind, spec.npu, spec.npus, tuple(links))


@functools.lru_cache(maxsize=16)
def cloudmatrix384(servers: int = 48) -> Topology:
    """A CloudMatrix384 SuperPod (or a slice of it): 16 910C dies per server, every die and CPU
    on the uniform UB fabric (global shared memory: any CPU reaches any die)."""
    _check_servers(servers, 48, "cm384")
    kind = "cm384-910c"
    spec = server_spec(kind)
    ub = effective_bw_bytes_per_s(link_spec("ub"))
    links: list[LinkDesc] = []
    for s in range(servers):
        for i in range(spec.npus):
            links.append(_link(f"s{s}/npu{i}/ub", "ub", ("tx", "rx"), ub))
        links.extend(_host_links(s, kind))
    return Topology("cm384", servers, kind, spec.npu, spec.npus, tuple(links))


def build(cluster: str, servers: int) -> Topology:
    """A topology by cluster name (what the fabric actor is constructed from)."""
    if cluster == "gen1":
        return gen1_cluster(servers)
    if cluster == "cm384":
        return cloudmatrix384(servers)
    raise ValueError(f"cluster: unknown cluster {cluster!r}; known: cm384, gen1")


@functools.lru_cache(maxsize=8192)
def _parse_endpoint(addr: str) -> tuple[int, str, int] | None:
    m = _ENDPOINT.match(addr)
    if m is None:
        return None
    if m.group(2) is None:
        return int(m.group(1)), "host" if m.group(3) else "ssd", -1
    return int(m.group(1)), "npu", int(m.group(2))


def _endpoint(topo: Topology, addr: str) -> tuple[int, str, int]:
    """(server, kind, npu index) of an endpoint address."""
    parsed = _parse_endpoint(addr)
    if parsed is None:
        raise ValueError(f"endpoint: {addr!r} is not hw/s<i>/npu<j>, hw/s<i>/host or hw/s<i>/ssd")
    server, kind, npu = parsed
    if server >= topo.servers:
        raise ValueError(
            f"endpoint: {addr!r}: the {topo.cluster} topology has {topo.servers} servers"
        )
    if kind == "npu" and npu >= topo.npus_per_server:
        raise ValueError(f"endpoint: {addr!r}: a server has {topo.npus_per_server} NPUs")
    return parsed


def route(topo: Topology, src: str, dst: str, via: str | None = None) -> Route:
    """The link directions a transfer from `src` to `dst` crosses."""
    s, skind, i = _endpoint(topo, src)
    t, dkind, j = _endpoint(topo, dst)
    if (s, skind, i) == (t, dkind, j):
        raise ValueError(f"route: src and dst are the same endpoint {src!r}")
    if skind == "npu" and dkind == "npu":
        return _npu_route(topo, s, i, t, j, via)
    if via is not None:
        raise ValueError(f"via: only NPU-to-NPU transfers choose a link, got via={via!r}")
    host_link = server_spec(topo.server_kind).host_link
    if topo.cluster == "gen1" and s != t:
        raise ValueError(f"route: gen1 has no host path from {src!r} to {dst!r} (other server)")
    if dkind == "npu":  # host DRAM or SSD -> NPU, through the source server's host side
        head = (f"s{s}/ssd:rd",) if skind == "ssd" else ()
        port = f"s{t}/npu{j}/{host_link}:" + ("h2d" if topo.cluster == "gen1" else "rx")
        return Route((*head, f"s{s}/host/{host_link}:h2d", port), host_link)
    if skind == "npu" and dkind == "host":
        port = f"s{s}/npu{i}/{host_link}:" + ("d2h" if topo.cluster == "gen1" else "tx")
        return Route((port, f"s{t}/host/{host_link}:d2h"), host_link)
    if skind == "ssd" and dkind == "host" and s == t:
        return Route((f"s{s}/ssd:rd",), SSD)
    raise ValueError(f"route: no path from {src!r} to {dst!r}")


def _npu_route(topo: Topology, s: int, i: int, t: int, j: int, via: str | None) -> Route:
    if topo.cluster == "cm384":
        if via not in (None, "ub"):
            raise ValueError(f"via: the cm384 topology moves NPU data over 'ub', got {via!r}")
        return Route((f"s{s}/npu{i}/ub:tx", f"s{t}/npu{j}/ub:rx"), "ub")
    if via not in (None, "hccs", "roce"):
        raise ValueError(f"via: gen1 NPUs talk over 'hccs' or 'roce', got {via!r}")
    if s == t and via != "roce":
        a, b = min(i, j), max(i, j)
        return Route((f"s{s}/hccs/{a}-{b}:{i}>{j}",), "hccs")
    if via == "hccs":
        raise ValueError(f"via: HCCS does not leave a gen1 server (s{s} -> s{t})")
    return Route((f"s{s}/npu{i}/roce:tx", f"s{t}/npu{j}/roce:rx"), "roce")


def fork_link_kinds(server_kind: str) -> tuple[str, ...]:
    """The link kinds an NPU-fork can use between NPUs of this server kind's cluster, scale-up
    first: those `route` accepts as `via` (a CloudMatrix384 SuperPod moves NPU data over UB
    only; its RoCE to other SuperPods is not modeled)."""
    spec = server_spec(server_kind)
    build_topo = {"gen1-910b": gen1_cluster, "cm384-910c": cloudmatrix384}.get(spec.kind)
    if build_topo is None:
        raise ValueError(f"server_kind: no topology is modeled for {spec.kind!r}")
    topo = build_topo(2)
    npu = npu_spec(spec.npu)
    kinds = []
    for kind in dict.fromkeys((npu.scale_up_link, npu.scale_out_link)):
        for dst in (npu_addr(0, 1), npu_addr(1, 0)):
            try:
                if route(topo, npu_addr(0, 0), dst, via=kind).link_kind == kind:
                    kinds.append(kind)
                    break
            except ValueError:
                continue
    return tuple(kinds)


def resource_link(resource: str) -> str:
    """The link a direction belongs to ("s0/npu3/roce:tx" -> "s0/npu3/roce")."""
    return resource.rpartition(":")[0]


def spawn_topology(driver: Any, topo: Topology, *, variance: bool = True,
                   servers: Collection[int] | None = None) -> list[str]:  # fmt: skip
    """Start the fabric, every host and every NPU of `topo` in `driver` (SimDriver or
    AsyncDriver); returns the addresses started. `variance` turns on the NPUs' seeded
    per-forward variance. `servers` (a partition of a simulation split by server) starts the
    hosts and NPUs of those servers only; the fabric still knows the whole topology."""
    from deepserve.adapters.hardware.devices.fabric import Fabric
    from deepserve.adapters.hardware.devices.host import Host
    from deepserve.adapters.hardware.devices.npu import Npu

    started = [driver.spawn(FABRIC, Fabric, cluster=topo.cluster, servers=topo.servers)]
    for s in range(topo.servers):
        if servers is not None and s not in servers:
            continue
        started.append(driver.spawn(host_addr(s), Host, server=s, server_kind=topo.server_kind,
                                    shared_reads=True))
        for j in range(topo.npus_per_server):
            started.append(driver.spawn(npu_addr(s, j), Npu, npu=topo.npu_kind, variance=variance))
    return started
