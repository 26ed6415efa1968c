"""Addresses, deterministic ids and the hybrid logical clock.

An address is a slash-separated string such as ``je/0`` or ``te/3/dp/1``: cheap to
hash and compare, readable in logs, and stable across processes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

_ADDRESS = re.compile(r"^[A-Za-z0-9_.:-]+(/[A-Za-z0-9_.:-]+)*$")
EXTERNAL_PREFIX: Final = "ext/"  # (Final: compiled code inlines it, compiled.py)


class BadAddress(ValueError):
    pass


def check_address(addr: str) -> str:
    if not isinstance(addr, str) or not _ADDRESS.match(addr):
        raise BadAddress(f"bad actor address {addr!r}: expected segments like 'te/3/dp/1'")
    return addr


def address(*parts: object) -> str:
    """``address("te", 3, "dp", 1) == "te/3/dp/1"``."""
    return check_address("/".join(str(p) for p in parts))


def deterministic_id(seed: int, actor: str, seq: int, n: int = 0) -> str:
    """An id derived only from the run seed, the actor and its sequence numbers."""
    h = hashlib.blake2b(f"{seed}/{actor}/{seq}/{n}".encode(), digest_size=8)
    return h.hexdigest()


# A hybrid logical clock packed into one int: physical microseconds in the high
# bits, a logical counter in the low 16. Packing keeps comparisons and storage cheap.
HLC_LOGICAL_BITS: Final = 16


def hlc_physical(now_s: float) -> int:
    return int(now_s * 1_000_000) << HLC_LOGICAL_BITS


def hlc_tick(local: int, now_s: float) -> int:
    """Local or send event."""
    pt = int(now_s * 1_000_000) << HLC_LOGICAL_BITS  # hlc_physical, inlined (hot path)
    return pt if pt > local else local + 1


def hlc_merge(local: int, remote: int, now_s: float) -> int:
    """Receive event: strictly after both the local clock and the sender's."""
    pt = int(now_s * 1_000_000) << HLC_LOGICAL_BITS  # hlc_physical, inlined (hot path)
    m = local if local > remote else remote
    return pt if pt > m else m + 1

