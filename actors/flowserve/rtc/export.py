"""Reading a sequence's KV out of the RTC for request migration (xLLM §3.5), pure.

Which copy of a block survives a fault is decided by who owns its memory (docs/recovery.md,
"KV that survives a fault"): the HBM copy dies with the device (crash, HBM fault) or cannot be
read (hang), the host DRAM copy lives as long as the TE's process and its host do. So what a
lost device still offers is the leading run of a chain whose blocks have a DRAM copy — a prefix,
because a target can use a block only after every block before it (prefix matching).
"""

from __future__ import annotations

from .state import NONE, Rtc


def dram_run(rtc: Rtc, block_hashes: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """The DRAM block ids of the longest prefix of `block_hashes` held in the DRAM tier (a copy
    still in flight does not count: its node has no DRAM block until the copy finishes)."""
    get = rtc.nodes.get
    out: list[int] = []
    for h in block_hashes:
        node = get(h)
        if node is None or node.dram == NONE:
            break
        out.append(node.dram)
    return tuple(out)


def unsaved(rtc: Rtc, block_hashes: tuple[int, ...] | list[int]) -> list[int]:
    """The hashes among `block_hashes` indexed in HBM without a DRAM copy (what a write-through
    backup still has to copy)."""
    get = rtc.nodes.get
    out: list[int] = []
    for h in block_hashes:
        node = get(h)
        if node is not None and node.hbm != NONE and node.dram == NONE:
            out.append(h)
    return out

