"""NPU-fork (DeepServe §6.2, Fig. 8, 10, 11), at `cluster/fork`: booting TEs get their weights
from a running TE of their model over the NPU-to-NPU links instead of PCIe.

A booting TE (boot.py, source "fork") sends `ForkRequest` after TE-Pre-Load. Requests that arrive
within `gather_s` of each other go out together: the coordinator picks a running TE of the model
and layout (from the membership the manager pushes to it as to every JE, which also names where
the members the recovery ladder moved run), and asks that TE's host for one broadcast per link
(`HostFork`, each rank's shard pipelined through the targets in HCCL's chunked chain): the targets
inside the source's scale-up domain over it (HCCS inside a Gen1 server; UB across a
CloudMatrix384), the ones beyond over the scale-out link (RoCE). The bytes cross the emulated
fabric, so they share its links max-min fairly with everything else there —
the source TE's own KV transfers included. Each TE gets `ForkLoaded` when its broadcast ends, or
`ForkNone` (no running TE of the model: scaling from zero; a failed broadcast), and then loads
from its host. Used by scale-out and by a replacement whenever a source exists.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from deepserve.actors.je.messages import TeGroupMembership
from deepserve.actors.ports.host import HostFork, HostLoadDone, HostLoadFailed
from deepserve.actors.ports.pod import TeSlot
from deepserve.core import Actor, Context, Event, Message

from .ladder_state import relocate
from .messages import ForkGather, ForkLoaded, ForkNone, ForkRequest

MAX_PENDING = 100_000  # a limit on everything


class ForkConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    slots: tuple[TeSlot, ...] = ()
    gather_s: float = 0.05
    domain_link: str = "hccs"  # the scale-up link
    domain: Literal["server", "cluster"] = "server"  # what one scale-up domain spans
    beyond_link: str = "roce"  # the scale-out link ("": none, targets beyond are refused)


class Queued(msgspec.Struct, frozen=True, kw_only=True):
    req: ForkRequest
    at_s: float


class Fork(msgspec.Struct, kw_only=True):
    source: str
    parts: dict[str, tuple[str, ...]]  # part req id -> the TEs it feeds
    links: dict[str, str]  # part req id -> link kind
    queued: dict[str, Queued]  # TE -> its request


class ForkState(msgspec.Struct, kw_only=True):
    ready: dict[str, tuple[str, ...]] = {}  # group -> its ready TEs
    pending: list[Queued] = []
    forks: dict[str, Fork] = {}
    started: int = 0
    served: int = 0  # TEs that got their weights by fork
    refused: int = 0  # requests answered ForkNone
    placed: dict[str, tuple[str, ...]] = {}  # te -> its NPUs, where it runs off its slot's NPUs


class ForkMembership(Event, frozen=True, kw_only=True):
    group: str
    tes: tuple[str, ...]
    placed: dict[str, tuple[str, ...]] = {}  # the push's: members the ladder moved -> their NPUs


class ForkQueued(Event, frozen=True, kw_only=True):
    req: ForkRequest
    at_s: float


class ForkStarted(Event, frozen=True, kw_only=True):
    fork_id: str
    source: str
    parts: dict[str, tuple[str, ...]]
    links: dict[str, str]
    tes: tuple[str, ...]  # every TE fed; their requests leave `pending`


class ForkRefused(Event, frozen=True, kw_only=True):
    tes: tuple[str, ...]
    reason: str


class ForkPartEnded(Event, frozen=True, kw_only=True):
    fork_id: str
    part: str
    ok: bool


class NpuForker(Actor[ForkState]):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.cfg = msgspec.convert(config or {}, ForkConfig)
        self.slots = {s.te: s for s in self.cfg.slots}

    def initial_state(self) -> ForkState:
        return ForkState()

    def evolve(self, s: ForkState, e: Event) -> ForkState:
        if isinstance(e, ForkMembership):
            s.ready[e.group] = e.tes
            for te, npus in e.placed.items():  # the manager's word, for TEs that booted any way
                self._place(s, te, npus)
        elif isinstance(e, ForkQueued):
            s.pending.append(Queued(req=e.req, at_s=e.at_s))
            self._place(s, e.req.te, e.req.npus)  # where the ladder moved it (relocate, substitute) the request says
        elif isinstance(e, ForkStarted | ForkRefused):
            gone = set(e.tes)
            taken = {q.req.te: q for q in s.pending if q.req.te in gone}
            s.pending = [q for q in s.pending if q.req.te not in gone]
            if isinstance(e, ForkStarted):
                s.forks[e.fork_id] = Fork(source=e.source, parts=dict(e.parts), links=dict(e.links), queued=taken)
                s.started += 1
            else:
                s.refused += len(e.tes)
        elif isinstance(e, ForkPartEnded):
            f = s.forks[e.fork_id]
            tes = f.parts.pop(e.part)
            for te in tes:
                f.queued.pop(te, None)
            s.served += len(tes) if e.ok else 0
            s.refused += 0 if e.ok else len(tes)
            if not f.parts:
                del s.forks[e.fork_id]
        return s

    def _place(self, s: ForkState, te: str, npus: tuple[str, ...]) -> None:
        """`te` runs on `npus`: kept when they are not its slot's (back on them: forgotten)."""
        slot = self.slots.get(te)
        if slot is not None and npus != slot.npus:
            s.placed[te] = npus
        else:
            s.placed.pop(te, None)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, TeGroupMembership):
            ctx.record(ForkMembership(group=f"{msg.model}/{msg.role}", tes=tuple(msg.tes), placed=dict(msg.placed)))
        elif isinstance(msg, ForkRequest):
            if len(self.state.pending) >= MAX_PENDING:
                ctx.send(msg.reply_to, ForkNone(te=msg.te, generation=msg.generation, reason="fork queue full"))
                return
            if not self.state.pending:
                ctx.after(self.cfg.gather_s, ForkGather(), key="gather")
            ctx.record(ForkQueued(req=msg, at_s=ctx.now()))
        elif isinstance(msg, ForkGather):
            self._gather(ctx)
        elif isinstance(msg, HostLoadDone | HostLoadFailed):
            self._part_ended(ctx, msg)

    def _sources(self, model: str, tp: int, queued: list[Queued]) -> list[TeSlot]:
        """Running TEs of the model and TP (any role: the weights are the same): an idle one
        first, then the one sharing a scale-up domain with the most requesters (HCCS over RoCE)."""
        ready = sorted({te for tes in self.state.ready.values() for te in tes})
        busy = {f.source for f in self.state.forks.values()}
        near: dict[int, int] = {}
        for q in queued:
            near[q.req.server] = near.get(q.req.server, 0) + 1
        found = [self._where(te) for te in ready if te in self.slots and self.slots[te].model == model
                 and self.slots[te].tp == tp]  # fmt: skip
        return sorted(found, key=lambda s: (s.te in busy, -near.get(s.server, 0), s.te))

    def _where(self, te: str) -> TeSlot:
        """Where `te` runs now: its slot, or the NPUs its fork boot asked from or the manager's push
        named (a TE the ladder relocated is forked from where it is, not where it was)."""
        npus = self.state.placed.get(te)
        return self.slots[te] if npus is None else relocate(self.slots[te], npus)

    def _gather(self, ctx: Context) -> None:
        by_layout: dict[tuple[str, int], list[Queued]] = {}
        for q in self.state.pending:
            by_layout.setdefault((q.req.model, q.req.tp), []).append(q)
        for (model, tp), queued in sorted(by_layout.items(), key=lambda kv: kv[0]):
            sources = self._sources(model, tp, queued)
            if not sources:
                self._refuse(ctx, queued, f"no running TE of {model} at tp={tp} to fork from")
                continue
            self._start(ctx, sources[0], queued)

    def _start(self, ctx: Context, src: TeSlot, queued: list[Queued]) -> None:
        """One broadcast per link: inside the source's scale-up domain, and beyond it."""
        cfg = self.cfg
        inside = [q for q in queued if cfg.domain == "cluster" or q.req.server == src.server]
        beyond = [q for q in queued if q not in inside]
        fork_id = f"fork{self.state.started}"
        parts: dict[str, tuple[str, ...]] = {}
        links: dict[str, str] = {}
        sends: list[tuple[str, HostFork]] = []
        if beyond and not cfg.beyond_link:
            self._refuse(ctx, beyond, f"{cfg.domain_link} does not reach beyond {src.te}'s domain")
            beyond = []
        for link, group in ((cfg.domain_link, inside), (cfg.beyond_link, beyond)):
            if not group:
                continue
            group = sorted(group, key=lambda q: (q.req.server, q.req.npus))  # the chain crosses servers once each
            part = f"{fork_id}:{link}"
            parts[part], links[part] = tuple(q.req.te for q in group), link
            targets = tuple(n for q in group for n in q.req.npus)  # every DP group of every TE: tp NPUs each
            sends.append((src.host, HostFork(req_id=part, model=src.model, sources=src.npus[: src.tp],
                                             targets=targets, via=link)))  # fmt: skip
        if not parts:
            return
        ctx.record(ForkStarted(fork_id=fork_id, source=src.te, parts=parts, links=links,
                               tes=tuple(te for tes in parts.values() for te in tes)))  # fmt: skip
        for host, msg in sends:
            ctx.send(host, msg)

    def _refuse(self, ctx: Context, queued: list[Queued], reason: str) -> None:
        ctx.record(ForkRefused(tes=tuple(q.req.te for q in queued), reason=reason))
        for q in queued:
            ctx.send(q.req.reply_to, ForkNone(te=q.req.te, generation=q.req.generation, reason=reason))

    def _part_ended(self, ctx: Context, msg: HostLoadDone | HostLoadFailed) -> None:
        fork_id = msg.req_id.partition(":")[0]
        f = self.state.forks.get(fork_id)
        if f is None or msg.req_id not in f.parts:
            return
        ok = isinstance(msg, HostLoadDone)
        queued = [f.queued[te] for te in f.parts[msg.req_id] if te in f.queued]
        source, link = f.source, f.links[msg.req_id]
        ctx.record(ForkPartEnded(fork_id=fork_id, part=msg.req_id, ok=ok))
        for q in queued:
            r = q.req
            if isinstance(msg, HostLoadDone):
                ctx.send(r.reply_to, ForkLoaded(te=r.te, generation=r.generation, source=source, path=msg.path,
                                                duration_s=ctx.now() - q.at_s, fork_id=fork_id))  # fmt: skip
            else:
                ctx.send(r.reply_to, ForkNone(te=r.te, generation=r.generation,
                                              reason=f"NPU-fork over {link} from {source} failed: {msg.reason}"))  # fmt: skip
