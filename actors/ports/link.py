"""The link port: moving bytes between endpoints over the fabric (HCCS, RoCE, UB, PCIe).

Endpoints are device addresses ("hw/s0/npu3", "hw/s0/host", "hw/s0/ssd"); the fabric resolves the
path (the links crossed), or the caller names the links itself. Concurrent transfers share each
link max-min fairly. A transfer completes exactly once: `LinkTransferDone` with all its bytes and
its fingerprint, or `LinkTransferFailed` (a link on its path went down, or the request was bad).
"""

from __future__ import annotations

from deepserve.core.messages import Message


class LinkTransfer(Message, frozen=True, kw_only=True):
    req_id: str
    src: str
    dst: str
    nbytes: int
    messages: int = 1  # control messages the transfer is split into (1 = one contiguous copy)
    fingerprint: str | None = None  # content digest (e.g. of the KV's tokens), delivered intact
    via: str | None = None  # force a link kind ("hccs", "roce", "ub"); None = the fabric's route
    path: tuple[str, ...] = ()  # explicit link names; overrides the route when given


class LinkTransferDone(Message, frozen=True, kw_only=True):
    req_id: str
    src: str
    dst: str
    nbytes: int
    duration_s: float  # from acceptance to the last byte, including setup and sharing
    link_kind: str  # the kind of link the bytes crossed ("hccs", "roce", "ub", "pcie", "ssd")
    fingerprint: str | None = None


class LinkTransferFailed(Message, frozen=True, kw_only=True):
    """The answer to a failed `LinkTransfer` or `LinkBroadcast`: no byte counts as delivered."""

    req_id: str
    reason: str
    link: str | None = None  # the link that failed it, when one did


class LinkBroadcast(Message, frozen=True, kw_only=True):
    """Send the same bytes from one endpoint to several (HCCL chain broadcast: each target
    forwards chunks to the next). Used by NPU-fork to load many new instances at once."""

    req_id: str
    src: str
    targets: tuple[str, ...]
    nbytes: int
    fingerprint: str | None = None
    via: str | None = None


class LinkBroadcastDone(Message, frozen=True, kw_only=True):
    req_id: str
    src: str
    targets: tuple[str, ...]
    nbytes: int  # bytes delivered to EACH target
    duration_s: float
    link_kind: str
    fingerprint: str | None = None


class LinkCancel(Message, frozen=True, kw_only=True):
    """Withdraw a transfer or broadcast this sender started: its bandwidth is freed at once
    and it is answered `LinkTransferFailed` (reason "cancelled"). Unknown ids are ignored:
    the transfer may have completed while the cancel was on its way."""

    req_id: str


class LinkProbe(Message, frozen=True, kw_only=True):
    """Ask for a link's condition (DistFlow link probing)."""

    req_id: str
    link: str


class LinkStatus(Message, frozen=True, kw_only=True):
    req_id: str
    link: str
    kind: str
    up: bool
    bw_factor: float  # 1.0 = nominal; < 1 when degraded
    capacity_bytes_per_s: float  # current capacity of each direction (0 when down)
    active_transfers: int
