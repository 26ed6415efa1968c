"""A DistFlow channel: the isolated transfer instance of ONE prefill–decode DP-group pair
(xDeepServe §5.1 step 7: "each prefill–decode TE pair operates with an isolated DistFlow instance
to limit failure domains"). The decode master spawns one per prefill master it pulls from, so the
channels of a TE form the M:N mesh between prefill and decode DP groups.

A receive (`KvRecv`): handshake with the prefill master (`KvPin`: it still holds the blocks; no
answer = peer dead), then `transfer(src, dst)` on raw block addresses — one `LinkTransfer` per TP
rank over the fabric (the fabric picks the backend: HCCS/UB memory copy, RoCE point-to-point):

- contiguous (P/D-Serve §3.6, block-free): the sender packs the blocks into one contiguous buffer,
  one message per rank (one per layer by layer); the receiver scatters it into its blocks
  (RecvScatter, an on-device copy not timed here: see docs/decisions.md);
- block: one message per block and per K/V buffer of each layer (`transfer_messages`).

Completion: every rank arrived and every block's fingerprint verified → `KvRecvDone(ok)` to the
decode master (its completion queue) and `KvRelease` to the prefill master; any failure (link
down, peer dead, timeout, a corrupted block) → `KvRecvDone(ok=False, reason)` — never a hang.
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.distflow.messages import (
    DfHello,
    DfHelloAck,
    KvPin,
    KvPinned,
    KvRecv,
    KvRecvDone,
    KvRelease,
    LinkCluster,
    LinkClustered,
    RecvTimeout,
)
from deepserve.actors.flowserve.distflow.probe import TIMEOUT, ProbeLink
from deepserve.actors.ports.link import (
    LinkCancel,
    LinkTransfer,
    LinkTransferDone,
    LinkTransferFailed,
)
from deepserve.core import Actor, AskFailed, Context, Event, Message


class ChannelConfig(msgspec.Struct, frozen=True, kw_only=True):
    src_master: str  # the prefill DP master this channel pulls from
    dst_master: str  # the decode DP master that owns it
    fabric: str = "hw/fabric"
    mode: str = "contiguous"  # or "block"
    granularity: str = "request"  # or "layer"
    layers: int = 32
    timeout_s: float = 30.0
    prober: str = ""  # link probing (probe.py): told of each failed or timed-out transfer ("": off)

    def spawn_config(self) -> dict[str, Any]:
        """As a spawn records it: `prober` left out while off (the record as before it existed)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        if not self.prober:
            del out["prober"]
        return out


class Recv(msgspec.Struct, kw_only=True):
    req: KvRecv
    started_s: float
    pending: list[str] = []  # link transfer ids not yet done
    nbytes: int = 0
    transfers: int = 0


class ChannelState(msgspec.Struct, kw_only=True):
    recvs: dict[str, Recv] = {}
    done: int = 0
    failed: int = 0
    cluster: dict[str, bool | None] = {}  # LinkCluster in progress: peer -> answered?
    cluster_req: str = ""
    cluster_to: str = ""


class ClusterStarted(Event, frozen=True):
    req_id: str
    reply_to: str
    peers: tuple[str, ...]


class PeerAnswered(Event, frozen=True):
    peer: str
    ok: bool


class ClusterEnded(Event, frozen=True):
    pass


class RecvStarted(Event, frozen=True):
    req: KvRecv
    at_s: float


class RecvSent(Event, frozen=True):
    task_id: str
    transfer_ids: tuple[str, ...]
    nbytes: int


class RecvPartDone(Event, frozen=True):
    task_id: str
    transfer_id: str


class RecvEnded(Event, frozen=True):
    task_id: str
    ok: bool


def _evolve(st: ChannelState, e: Event) -> ChannelState:
    if isinstance(e, RecvStarted):
        st.recvs[e.req.task_id] = Recv(req=e.req, started_s=e.at_s)
    elif isinstance(e, RecvSent):
        r = st.recvs[e.task_id]
        r.pending, r.nbytes, r.transfers = list(e.transfer_ids), e.nbytes, len(e.transfer_ids)
    elif isinstance(e, RecvPartDone):
        st.recvs[e.task_id].pending.remove(e.transfer_id)
    elif isinstance(e, RecvEnded):
        st.recvs.pop(e.task_id)
        st.done += e.ok
        st.failed += not e.ok
    elif isinstance(e, ClusterStarted):
        st.cluster = dict.fromkeys(e.peers)
        st.cluster_req, st.cluster_to = e.req_id, e.reply_to
    elif isinstance(e, PeerAnswered):
        st.cluster[e.peer] = e.ok
    elif isinstance(e, ClusterEnded):
        st.cluster, st.cluster_req, st.cluster_to = {}, "", ""
    else:
        raise AssertionError(f"distflow channel: unknown event {type(e).__name__}")
    return st


def transfer_messages(mode: str, granularity: str, nblocks: int, layers: int) -> int:
    """Control messages of one rank's transfer. A paged KV cache keeps K and V of every layer in
    separate pools, so block-by-block sends 2 x layers buffers per block; block-free (contiguous)
    packs everything into one send buffer — one message per request, or one per layer."""
    if mode == "contiguous":
        return layers if granularity == "layer" else 1
    return nblocks * 2 * layers


def encode_fingerprints(fps: tuple[int, ...]) -> str:
    """The digest a transfer carries: every block's fingerprint, in order (hex, comma-joined)."""
    return ",".join(f"{f:016x}" for f in fps)


def decode_fingerprints(s: str | None) -> tuple[int, ...]:
    return tuple(int(x, 16) for x in s.split(",")) if s else ()


def verify_blocks(expected: tuple[int, ...], got: tuple[int, ...]) -> str | None:
    """The first block whose fingerprint differs, as a reason; None when all match."""
    if len(got) != len(expected):
        return f"{len(got)} block fingerprints arrived, {len(expected)} expected"
    for i, (e, g) in enumerate(zip(expected, got, strict=True)):
        if e != g:
            return f"KV block {i} fingerprint mismatch: expected {e:016x}, got {g:016x}"
    return None


class DistFlowChannel(Actor[ChannelState]):
    def __init__(self, config: Any) -> None:
        self.cfg = config if isinstance(config, ChannelConfig) else msgspec.convert(config, ChannelConfig)

    def initial_state(self) -> ChannelState:
        return ChannelState()

    def evolve(self, state: ChannelState, event: Event) -> ChannelState:
        return _evolve(state, event)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, KvRecv):
            if msg.task_id in self.state.recvs:
                return
            ctx.record(RecvStarted(msg, ctx.now()))
            ctx.ask(self.cfg.src_master, KvPin(transfer_id=msg.src.transfer_id, task_id=msg.task_id),
                    self.cfg.timeout_s)  # fmt: skip
            ctx.after(self.cfg.timeout_s, RecvTimeout(task_id=msg.task_id), key=f"to:{msg.task_id}")
        elif isinstance(msg, KvPinned):
            self._pinned(ctx, msg)
        elif isinstance(msg, LinkTransferDone):
            self._part_done(ctx, msg)
        elif isinstance(msg, LinkTransferFailed):
            tid, _, rank = msg.req_id.rpartition("#")
            self._probe(ctx, tid, int(rank) if rank.isdigit() else 0, msg.reason)
            self._end(ctx, tid, f"link transfer failed: {msg.reason}")
        elif isinstance(msg, RecvTimeout):
            self._probe(ctx, msg.task_id, 0, TIMEOUT)
            self._end(ctx, msg.task_id, f"timed out after {self.cfg.timeout_s}s")
        elif isinstance(msg, LinkCluster):
            self._cluster(ctx, msg)
        elif isinstance(msg, DfHelloAck):
            self._peer(ctx, msg.peer, True)
        elif isinstance(msg, AskFailed) and self.state.cluster.get(msg.target, False) is None:
            self._peer(ctx, msg.target, False)
        elif isinstance(msg, AskFailed) and msg.target == self.cfg.src_master:
            # the handshake went unanswered: the prefill side is dead (or hung)
            for tid, r in list(self.state.recvs.items()):
                if not r.transfers:
                    self._end(ctx, tid, f"peer {msg.target} dead: {msg.reason}")

    # ---- control plane ------------------------------------------------------------------
    def _cluster(self, ctx: Context, msg: LinkCluster) -> None:
        if self.state.cluster_req:
            ctx.reply(LinkClustered(req_id=msg.req_id, ok=False, dead=msg.peers))  # one at a time
            return
        ctx.record(ClusterStarted(msg.req_id, ctx.sender, msg.peers))
        for peer in dict.fromkeys(msg.peers):
            ctx.ask(peer, DfHello(channel=ctx.self), self.cfg.timeout_s)
        if not msg.peers:
            self._peer(ctx, "", True)

    def _peer(self, ctx: Context, peer: str, ok: bool) -> None:
        st = self.state
        if peer in st.cluster and st.cluster[peer] is None:
            ctx.record(PeerAnswered(peer, ok))
        if any(v is None for v in st.cluster.values()):
            return
        live = tuple(p for p, v in st.cluster.items() if v)
        dead = tuple(p for p, v in st.cluster.items() if not v)
        ctx.send(st.cluster_to, LinkClustered(req_id=st.cluster_req, ok=not dead, live=live, dead=dead))
        ctx.record(ClusterEnded())

    def _pinned(self, ctx: Context, msg: KvPinned) -> None:
        r = self.state.recvs.get(msg.task_id)
        if r is None or r.transfers:
            return
        if not msg.ok:
            self._end(ctx, msg.task_id, f"peer refused: {msg.reason}")
            return
        req, cfg = r.req, self.cfg
        nblocks = len(req.src.block_ids)
        messages = transfer_messages(cfg.mode, cfg.granularity, nblocks, cfg.layers)
        nbytes = nblocks * req.src.block_bytes
        fps = encode_fingerprints(req.src.fingerprints)
        ids = []
        for i, src_npu in enumerate(req.src.npus):
            tid = f"{req.task_id}#{i}"
            ids.append(tid)
            ctx.send(cfg.fabric, LinkTransfer(
                req_id=tid, src=src_npu, dst=req.dst_npus[i % len(req.dst_npus)], nbytes=max(nbytes, 1),
                messages=messages, fingerprint=fps,
            ))  # fmt: skip
        ctx.record(RecvSent(req.task_id, tuple(ids), nbytes * len(ids)))

    def _part_done(self, ctx: Context, msg: LinkTransferDone) -> None:
        task_id = msg.req_id.rpartition("#")[0]
        r = self.state.recvs.get(task_id)
        if r is None or msg.req_id not in r.pending:
            return
        got = list(decode_fingerprints(msg.fingerprint))
        c = r.req.corrupt_block
        if c is not None and 0 <= c < len(got):
            got[c] ^= 1 << 17  # the injected fault: one bit of block c flipped in transit
        bad = verify_blocks(r.req.expected, tuple(got))
        if bad is not None:
            self._end(ctx, task_id, f"KV integrity: {bad}")
            return
        ctx.record(RecvPartDone(task_id, msg.req_id))
        if not self.state.recvs[task_id].pending:
            self._end(ctx, task_id, None)

    def _probe(self, ctx: Context, task_id: str, rank: int, cause: str) -> None:
        """Link probing (probe.py): a transfer on the path of `rank` failed or timed out."""
        r = self.state.recvs.get(task_id)
        if not self.cfg.prober or r is None or not r.transfers:
            return  # off, or nothing was on the link yet (the handshake's failures are the peer's)
        req = r.req
        src, dst = req.src.npus[rank % len(req.src.npus)], req.dst_npus[rank % len(req.dst_npus)]
        ctx.send(self.cfg.prober, ProbeLink(task_id=task_id, src=src, dst=dst, cause=cause, failed_s=ctx.now()))

    def _end(self, ctx: Context, task_id: str, reason: str | None) -> None:
        r = self.state.recvs.get(task_id)
        if r is None:
            return
        for tid in r.pending:
            ctx.send(self.cfg.fabric, LinkCancel(req_id=tid))
        ctx.cancel(f"to:{task_id}")
        ctx.record(RecvEnded(task_id, reason is None))
        done = KvRecvDone(task_id=task_id, ok=reason is None, reason=reason or "", nbytes=r.nbytes,
                          duration_s=ctx.now() - r.started_s, transfers=r.transfers)  # fmt: skip
        ctx.send(self.cfg.dst_master, done)
        ctx.send(self.cfg.src_master, KvRelease(transfer_id=r.req.src.transfer_id))
