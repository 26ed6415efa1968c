"""DistFlow's messages: the DP masters' side of a P–D channel, and the channel's control plane."""

from __future__ import annotations

from typing import Literal

from deepserve.actors.flowserve.messages import KvHandle
from deepserve.core import Message


class LinkCluster(Message, frozen=True, kw_only=True):
    """Control plane (DeepServe §4.4): form the peer group of a channel — greet every peer (a DP
    master) and answer `LinkClustered` with who answered. Receives need no prior LinkCluster (the
    pin handshake checks the peer), but an operator or a test can check a mesh with it."""

    req_id: str
    peers: tuple[str, ...]


class LinkClustered(Message, frozen=True, kw_only=True):
    req_id: str
    ok: bool
    live: tuple[str, ...] = ()
    dead: tuple[str, ...] = ()


class DfHello(Message, frozen=True, kw_only=True):
    """A channel greets a peer DP master (answered `DfHelloAck`)."""

    channel: str


class DfHelloAck(Message, frozen=True, kw_only=True):
    peer: str


class KvRecv(Message, frozen=True, kw_only=True):
    """D master -> its channel: pull `src`'s blocks into `dst_blocks` on `dst_npus` for `task_id`."""

    task_id: str
    src: KvHandle
    dst_npus: tuple[str, ...]
    dst_blocks: tuple[int, ...]
    expected: tuple[int, ...]  # fingerprints the decode side computed from its own prompt
    corrupt_block: int | None = None  # an injected fault travels with the receive it hits


class KvRecvDone(Message, frozen=True, kw_only=True):
    """Channel -> D master: the completion-queue entry of one receive."""

    task_id: str
    ok: bool
    reason: str = ""
    nbytes: int = 0
    duration_s: float = 0.0
    transfers: int = 0  # link transfers it took (1 contiguous; one per block otherwise)


class KvPin(Message, frozen=True, kw_only=True):
    """Channel -> P master (the SEND/RECV handshake): keep holding `transfer_id`, I am pulling."""

    transfer_id: str
    task_id: str


class KvPinned(Message, frozen=True, kw_only=True):
    task_id: str
    ok: bool
    reason: str = ""


class HoldExpired(Message, frozen=True, kw_only=True):
    """Timer on the P master: nobody pulled the registered transfer in time."""

    transfer_id: str


class RecvTimeout(Message, frozen=True, kw_only=True):
    task_id: str


class KvRelease(Message, frozen=True, kw_only=True):
    """Channel -> P master: the decode side has the KV (or gave up): free the held blocks."""

    transfer_id: str


class CorruptKvBlock(Message, frozen=True, kw_only=True):
    """A fault input (tests, `deepserve fault`): the next receive of `task_id` (or of any task
    when None) delivers block `block_index` with a corrupted fingerprint."""

    task_id: str | None = None
    block_index: int = 0


TransferMode = Literal["contiguous", "block"]
Granularity = Literal["request", "layer"]
