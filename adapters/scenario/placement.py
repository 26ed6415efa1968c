"""Where a scenario's TEs go: which servers, which NPUs, which role — a pure function.

TEs are packed whole onto servers in order (a TE never spans servers: its TP group talks over
HCCS). In PD mode over RoCE the decode TEs start on a fresh server, so the KV really crosses the
RoCE NICs between servers, as in a P/D-Serve deployment; over HCCS they share the prefill TEs'
server (the link named is the one the KV crosses).
"""

from __future__ import annotations

import msgspec

from .schema import NPUS_PER_SERVER, Cluster


class TePlacement(msgspec.Struct, frozen=True):
    addr: str  # "te/0", ...
    role: str  # "colocated", "prefill" or "decode"
    server: int
    npus: tuple[str, ...]  # tp * dp_groups NPU addresses, DP group g owns npus[g*tp:(g+1)*tp]


class Placement(msgspec.Struct, frozen=True):
    servers: int
    tes: tuple[TePlacement, ...]

    def role(self, role: str) -> list[str]:
        return [t.addr for t in self.tes if t.role == role]


def place(c: Cluster) -> Placement:
    per_te = c.npus_per_te()
    per_server = NPUS_PER_SERVER[c.topology]
    slots = per_server // per_te
    if slots < 1:
        raise ValueError(f"cluster.tp: a TE needs {per_te} NPUs, a server has {per_server}")
    if c.mode == "colocated":
        groups = [("colocated", c.tes)]
    else:
        groups = [("prefill", c.prefill_tes), ("decode", c.decode_tes)]
    tes: list[TePlacement] = []
    server, slot = 0, 0
    for gi, (role, count) in enumerate(groups):
        if gi > 0 and c.link == "roce" and slot > 0:
            server, slot = server + 1, 0  # decode TEs on their own servers: KV crosses RoCE
        for _ in range(count):
            if slot == slots:
                server, slot = server + 1, 0
            first = slot * per_te
            npus = tuple(f"hw/s{server}/npu{j}" for j in range(first, first + per_te))
            tes.append(TePlacement(f"te/{len(tes)}", role, server, npus))
            slot += 1
    return Placement(server + 1, tuple(tes))
