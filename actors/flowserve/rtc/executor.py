"""The RTC executor: the block memory on a DP group's NPUs, and the copies between tiers.

Thin on purpose (DeepServe §4.3: "the master ... making decisions about allocation and data
movement, while each executor runs an RTC executor to perform these actions"): at start it
reserves the HBM "kv" region for the master's whole pool on every NPU of the group (the NPU
port's `NpuAlloc`), and for each `ExecuteCopy` it moves every rank's shard of those blocks over
the fabric (the link port's `LinkTransfer`, NPU <-> the server's host DRAM) and answers
`CopyExecuted` once all ranks are done — or failed, if any failed. A block is not contiguous
with its neighbours, so a copy is sent block by block (`messages = blocks`).

The DRAM pool is bookkeeping of the master (`RtcConfig.dram_blocks`): the host port has no
reservation message for it yet (its DRAM model is the page cache of model files).
"""

from __future__ import annotations

import msgspec

from deepserve.actors.ports.link import LinkTransfer, LinkTransferDone, LinkTransferFailed
from deepserve.actors.ports.npu import NpuAlloc, NpuAllocFailed, NpuAllocOk, NpuError
from deepserve.core.actor import Actor
from deepserve.core.context import Context
from deepserve.core.messages import AskFailed, Event, Message

from .apply import SWAP_OUT
from .messages import CopyExecuted, ExecuteCopy, KvReserved


class Pending(msgspec.Struct, gc=False):
    reply_to: str
    parts: int  # rank transfers not yet answered
    failed: str = ""
    started_s: float = 0.0


class ExecutorState(msgspec.Struct):
    reserved: list[str] = []  # NPUs whose kv region is reserved
    failed: str = ""
    copies: dict[str, Pending] = {}


class KvRegionReserved(Event, frozen=True, kw_only=True):
    npu: str
    ok: bool
    reason: str = ""


class CopyIssued(Event, frozen=True, kw_only=True):
    copy_id: str
    reply_to: str
    parts: int
    at_s: float


class CopyPartEnded(Event, frozen=True, kw_only=True):
    copy_id: str
    ok: bool
    reason: str = ""


class RtcExecutor(Actor[ExecutorState]):
    """One per DP group. `npus`: the group's NPU addresses (one TP rank each); `host`: the
    server's host endpoint; `block_bytes`: one block's KV on ONE rank (all layers)."""

    def __init__(self, npus: list[str], host: str, block_bytes: int, hbm_blocks: int,
                 master: str | None = None, fabric: str = "hw/fabric", region: str = "kv",
                 timeout_s: float = 30.0) -> None:  # fmt: skip
        if not npus or block_bytes <= 0 or hbm_blocks <= 0 or timeout_s <= 0:
            raise ValueError("RtcExecutor needs npus, block_bytes > 0, hbm_blocks > 0, timeout_s > 0")
        self.npus, self.host, self.fabric, self.region = tuple(npus), host, fabric, region
        self.block_bytes, self.master, self.timeout_s = block_bytes, master, timeout_s
        self.region_bytes = hbm_blocks * block_bytes

    def initial_state(self) -> ExecutorState:
        return ExecutorState()

    def on_start(self, ctx: Context) -> None:
        for i, npu in enumerate(self.npus):
            alloc = NpuAlloc(req_id=f"kv:{i}", region=self.region, nbytes=self.region_bytes)
            ctx.ask(npu, alloc, self.timeout_s)

    def evolve(self, s: ExecutorState, e: Event) -> ExecutorState:
        if isinstance(e, CopyPartEnded):
            p = s.copies[e.copy_id]
            p.parts -= 1
            if not e.ok and not p.failed:
                p.failed = e.reason
            if p.parts == 0:
                del s.copies[e.copy_id]
        elif isinstance(e, CopyIssued):
            s.copies[e.copy_id] = Pending(reply_to=e.reply_to, parts=e.parts, started_s=e.at_s)
        elif isinstance(e, KvRegionReserved):
            if e.ok:
                s.reserved.append(e.npu)
            elif not s.failed:
                s.failed = f"{e.npu}: {e.reason}"
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, ExecuteCopy):
            self._execute(ctx, msg)
        elif isinstance(msg, LinkTransferDone | LinkTransferFailed):
            self._part(ctx, msg)
        elif isinstance(msg, NpuAllocOk | NpuAllocFailed | NpuError | AskFailed):
            self._reserved(ctx, msg)

    def _execute(self, ctx: Context, msg: ExecuteCopy) -> None:
        n = len(msg.hbm)
        if self.state.failed or n == 0 or msg.copy_id in self.state.copies:
            why = self.state.failed or ("empty copy" if n == 0 else "duplicate copy id")
            ctx.send(ctx.sender, CopyExecuted(copy_id=msg.copy_id, ok=False, reason=why))
            return
        ctx.record(CopyIssued(copy_id=msg.copy_id, reply_to=ctx.sender, parts=len(self.npus),
                              at_s=ctx.now()))  # fmt: skip
        for rank, npu in enumerate(self.npus):
            src, dst = (npu, self.host) if msg.kind == SWAP_OUT else (self.host, npu)
            ctx.send(self.fabric, LinkTransfer(req_id=f"{msg.copy_id}:{rank}", src=src, dst=dst,
                                               nbytes=n * self.block_bytes, messages=n))  # fmt: skip

    def _part(self, ctx: Context, msg: LinkTransferDone | LinkTransferFailed) -> None:
        copy_id = msg.req_id.rpartition(":")[0]
        p = self.state.copies.get(copy_id)
        if p is None:
            return  # not ours, or a late answer after the copy was settled
        reason = msg.reason if isinstance(msg, LinkTransferFailed) else ""
        ctx.record(CopyPartEnded(copy_id=copy_id, ok=isinstance(msg, LinkTransferDone), reason=reason))
        if copy_id not in self.state.copies:  # the last rank answered
            done = CopyExecuted(copy_id=copy_id, ok=not p.failed, reason=p.failed,
                                duration_s=ctx.now() - p.started_s)  # fmt: skip
            ctx.send(p.reply_to, done)

    def _reserved(self, ctx: Context, msg: Message) -> None:
        was_failed = bool(self.state.failed)
        if isinstance(msg, NpuAllocOk):
            npu = self.npus[int(msg.req_id.partition(":")[2])]
            ctx.record(KvRegionReserved(npu=npu, ok=True))
        elif isinstance(msg, AskFailed):
            ctx.record(KvRegionReserved(npu=msg.target, ok=False, reason=msg.reason))
        else:
            reason = msg.reason  # type: ignore[attr-defined]
            ctx.record(KvRegionReserved(npu=ctx.sender, ok=False, reason=reason))
        st = self.state
        if self.master is not None and (len(st.reserved) == len(self.npus) or st.failed and not was_failed):
            ctx.send(self.master, KvReserved(ok=not st.failed, npus=tuple(st.reserved),
                                                 region_bytes=self.region_bytes, reason=st.failed))  # fmt: skip
