"""One pass over a run's log for `replay report` and `replay export`: the facts a person reads an
incident by — every request's terminal record, every routing decision, every fault with the
control plane's answer (declared failed, booted, ready), each TE's batches and KV blocks in use.

Streams the log once and decodes only the event types it keeps; the hottest (batches, KV block
changes) through small structs of the fields read here (msgspec skips the rest of a payload). A
request's `why` hops are kept undecoded and built (replay/why.py) only for the requests a report
shows (`why_text`).
"""

from __future__ import annotations

import json
import re
from array import array
from collections import defaultdict
from typing import Any

import msgspec

from deepserve.core import decode
from deepserve.persistence.api import LogReader

from .common import pick_run
from .why import (
    CONTROL_TYPES,
    FAULT_SOURCES,
    HOP_TYPES,
    _fault_hop,
    _load_types,
    _with_faults,
    why_lines,
)

_TE = re.compile(r"^(te/[^/]+)")  # a TE's actors: te/3, te/3/dp/0, te/3/hb, te/3/boot
DEFAULT_SLO = {"ttft_ms": 2000.0, "tpot_ms": 100.0}  # cluster/schema.py's defaults (a log with no [slo])


class _Planned(msgspec.Struct):
    step: int
    entries: msgspec.Raw = msgspec.Raw(b"\x90")


class _Ended(msgspec.Struct):
    step: int
    ends_s: list[float] = []
    failed: str = ""


class _Alloc(msgspec.Struct):
    seq: str
    shared: list[int] = []
    blocks: list[int] = []


class _Freed(msgspec.Struct):
    seq: str


class _Copy(msgspec.Struct):
    kind: str
    seq: str | None = None
    hbm: list[int] = []
    shared: list[int] = []


class _Rid(msgspec.Struct):
    request_id: str = ""


class _RtcHead(msgspec.Struct):
    ref: msgspec.Raw


class _MasterHead(msgspec.Struct):
    rtc: _RtcHead | None = None


_PLANNED = msgspec.msgpack.Decoder(_Planned)
_ENDED = msgspec.msgpack.Decoder(_Ended)
_ALLOC = msgspec.msgpack.Decoder(_Alloc)
_FREED = msgspec.msgpack.Decoder(_Freed)
_COPY = msgspec.msgpack.Decoder(_Copy)
_RID = msgspec.msgpack.Decoder(_Rid)
_MASTER = msgspec.msgpack.Decoder(_MasterHead)


def array_len(raw: msgspec.Raw) -> int:
    """The element count of a msgpack array from its header (fixarray, array 16, array 32)."""
    head = bytes(memoryview(raw)[:5])
    b = head[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return int.from_bytes(head[1:3], "big")
    if b == 0xDD:
        return int.from_bytes(head[1:5], "big")
    return 0  # nil (no array)


def te_of(actor: str) -> str | None:
    m = _TE.match(actor)
    return m.group(1) if m else None


class TeLane(msgspec.Struct):
    """One TE's timeline: its batches (planned at, last pass ended at, tasks in it, failed) and the
    KV blocks its running sequences hold, at each change (summed over its DP groups)."""

    batch_start: array = msgspec.field(default_factory=lambda: array("d"))
    batch_end: array = msgspec.field(default_factory=lambda: array("d"))
    batch_tasks: array = msgspec.field(default_factory=lambda: array("i"))
    batch_failed: int = 0
    kv_t: array = msgspec.field(default_factory=lambda: array("d"))
    kv_used: array = msgspec.field(default_factory=lambda: array("i"))
    kv_capacity: int = 0  # HBM blocks (0: unknown, no snapshot of its DP masters)


class Facts(msgspec.Struct, kw_only=True):
    run_id: str
    mode: str
    label: str
    scenario: str
    slo_ttft_ms: float
    slo_tpot_ms: float
    end_t: float = 0.0
    requests: dict[str, dict[str, Any]] = {}
    decisions: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []  # injected faults and the control plane's answers, by time
    lanes: dict[str, TeLane] = {}
    boots: list[dict[str, Any]] = []  # te, generation, start_s, ready_s (None: never), replacing
    hops: dict[str, list[tuple[float, str, str, bytes]]] = {}  # request id -> raw why hops
    fault_hops: list[dict[str, Any]] = []  # what replay why merges into a request's hops
    task_failures: list[dict[str, Any]] = []  # a task ended not completed: t, request_id, te, status, reason

    def why_text(self, request_id: str) -> list[str]:
        """`deepserve replay why`'s lines for the request (from the hops kept in the pass)."""
        raw = self.hops.get(request_id)
        if not raw:
            return []
        hops = []
        for t, actor, etype, payload in raw:
            data = msgspec.to_builtins(decode(etype, payload))
            data.pop("type", None)
            hops.append({"t": t, "actor": actor, "event": etype, **data})
        return list(why_lines(_with_faults(hops, self.fault_hops)))


class _Kv:
    """A DP master's RTC blocks in use by sequences (reference counts), for the KV lane."""

    __slots__ = ("ref", "seqs", "used")

    def __init__(self) -> None:
        self.ref: dict[int, int] = defaultdict(int)
        self.seqs: dict[str, list[int]] = {}
        self.used = 0

    def hold(self, seq: str, blocks: list[int]) -> None:
        ref = self.ref
        for b in blocks:
            if ref[b] == 0:
                self.used += 1
            ref[b] += 1
        self.seqs.setdefault(seq, []).extend(blocks)

    def free(self, seq: str) -> None:
        ref = self.ref
        for b in self.seqs.pop(seq, ()):
            ref[b] -= 1
            if ref[b] == 0:
                self.used -= 1


def collect(reader: LogReader, run_id: str | None = None) -> Facts:
    """The run's facts, from one pass over its log."""
    _load_types()
    run = pick_run(reader, run_id)
    config = _config(run.config)
    slo = {**DEFAULT_SLO, **(config.get("slo") or {})}
    facts = Facts(run_id=run.run_id, mode=run.mode, label=reader.label, scenario=str(config.get("name") or ""),
                  slo_ttft_ms=float(slo["ttft_ms"]), slo_tpot_ms=float(slo["tpot_ms"]), requests={}, decisions=[],
                  faults=[], lanes={}, boots=[], hops={}, fault_hops=[], task_failures=[])  # fmt: skip
    _Pass(facts).run(reader)
    return facts


def _config(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class _Pass:
    """The one pass: a handler per kept event type."""

    def __init__(self, facts: Facts) -> None:
        self.f = facts
        self.kv: dict[str, _Kv] = {}  # DP master -> its blocks
        self.kv_te: dict[str, int] = defaultdict(int)  # TE -> blocks in use over its DP masters
        self.planned: dict[tuple[str, int], tuple[float, int]] = {}  # (actor, step) -> (t, tasks)
        self.capacity: dict[str, int] = {}  # DP master -> HBM blocks (its last snapshot)
        self.booting: dict[tuple[str, int], dict[str, Any]] = {}

    def lane(self, te: str) -> TeLane:
        lane = self.f.lanes.get(te)
        if lane is None:
            lane = self.f.lanes[te] = TeLane()
        return lane

    def run(self, reader: LogReader) -> None:
        f = self.f
        for step in reader.steps(f.run_id):
            inp = step.input
            t = inp.t
            if inp.src in FAULT_SOURCES:
                hop = _fault_hop(inp)
                f.fault_hops.append(hop)
                f.faults.append({"t": t, "category": "injected", "kind": inp.type, "target": inp.actor,
                                 "te": te_of(inp.actor) or str(hop["fields"].get("te") or ""), "source": inp.src, "detail": _detail(hop["fields"])})  # fmt: skip
            for ev in step.events:
                self.event(t, inp.actor, ev.type, ev.payload)
            if step.snapshot is not None and "/dp/" in step.snapshot.actor:
                self.snapshot(step.snapshot.actor, step.snapshot.payload)
        f.end_t = max(f.end_t, t) if f.lanes or f.requests else 0.0
        for _key, boot in self.booting.items():
            f.boots.append(boot)
        f.boots.sort(key=lambda b: (b["start_s"], b["te"]))
        for actor, cap in self.capacity.items():
            te = te_of(actor)
            if te is not None:
                self.lane(te).kv_capacity += cap

    def event(self, t: float, actor: str, etype: str, payload: bytes) -> None:
        f = self.f
        if etype in HOP_TYPES:
            self.hop(t, actor, etype, payload)
        elif etype == "BatchPlanned":
            p = _PLANNED.decode(payload)
            self.planned[(actor, p.step)] = (t, array_len(p.entries))
        elif etype == "BatchEnded":
            self.batch_end(t, actor, _ENDED.decode(payload))
        elif etype == "RtcBlocksAllocated":
            a = _ALLOC.decode(payload)
            self.kv_change(t, actor, lambda kv: kv.hold(a.seq, a.shared + a.blocks))
        elif etype == "RtcFreed":
            seq = _FREED.decode(payload).seq
            self.kv_change(t, actor, lambda kv: kv.free(seq))
        elif etype == "RtcCopyStarted":
            c = _COPY.decode(payload)
            if c.kind == "populate" and c.seq:
                self.kv_change(t, actor, lambda kv: kv.hold(c.seq, c.shared + c.hbm))
        elif etype == "RtcCleared":
            self.kv_change(t, actor, lambda kv: kv.__init__())  # type: ignore[misc]
        elif etype in CONTROL_TYPES or etype == "TeLaunching":
            self.control(t, actor, etype, msgspec.to_builtins(decode(etype, payload)))
        if etype in CONTROL_TYPES:
            data = msgspec.to_builtins(decode(etype, payload))
            data.pop("type", None)
            f.fault_hops.append({"t": t, "actor": actor, "event": "Control", "kind": etype, **data})

    def hop(self, t: float, actor: str, etype: str, payload: bytes) -> None:
        f = self.f
        if etype in ("JobFinished", "RequestFinished"):
            done = msgspec.to_builtins(decode(etype, payload))["done"]
            f.requests[done["request_id"]] = _request_row(done, f, self._je(done["request_id"]) or actor)
            f.hops.setdefault(done["request_id"], []).append((t, actor, etype, payload))
            return
        rid = _RID.decode(payload).request_id
        if not rid:
            return
        f.hops.setdefault(rid, []).append((t, actor, etype, payload))
        if etype == "RouteDecided":
            d = msgspec.to_builtins(decode(etype, payload))
            f.decisions.append(_decision_row(t, actor, d))
        elif etype == "GatewayRefused":
            r = msgspec.to_builtins(decode(etype, payload))
            from deepserve.actors.gateway.messages import REFUSED_429

            done = {"request_id": rid, "status": "failed", "reason": f"{REFUSED_429}{r['reason']}", "arrival_s": t,
                    "first_token_s": None, "finish_s": t, "prompt_tokens": 0, "cached_prompt_tokens": 0,
                    "output_tokens": 0, "te": ""}  # fmt: skip
            f.requests[rid] = _request_row(done, f, actor)
        elif etype == "JeTaskEnded":
            e = msgspec.to_builtins(decode(etype, payload))
            if e["status"] != "completed":
                f.task_failures.append({"t": t, "request_id": rid, "te": e["te"], "status": e["status"],
                                        "reason": e["reason"]})  # fmt: skip

    def _je(self, rid: str) -> str:
        for _t, _actor, etype, payload in self.f.hops.get(rid, ()):
            if etype == "GatewayRouted":
                return str(msgspec.to_builtins(decode(etype, payload))["je"])
        return ""

    def batch_end(self, t: float, actor: str, e: _Ended) -> None:
        start = self.planned.pop((actor, e.step), None)
        te = te_of(actor)
        if start is None or te is None:
            return
        lane = self.lane(te)
        lane.batch_start.append(start[0])
        lane.batch_end.append(max(e.ends_s) if e.ends_s else t)
        lane.batch_tasks.append(start[1])
        lane.batch_failed += bool(e.failed)

    def kv_change(self, t: float, actor: str, change: Any) -> None:
        te = te_of(actor)
        if te is None:
            return
        kv = self.kv.get(actor)
        if kv is None:
            kv = self.kv[actor] = _Kv()
        before = kv.used
        change(kv)
        if kv.used != before:
            total = self.kv_te[te] = self.kv_te[te] + kv.used - before
            lane = self.lane(te)
            lane.kv_t.append(t)
            lane.kv_used.append(total)

    def lost(self, t: float, te: str) -> None:
        """A TE declared failed holds no KV any more: its generation's HBM went with it (its
        replacement's DP masters start empty, under the same addresses)."""
        for actor in [a for a in self.kv if te_of(a) == te]:
            del self.kv[actor]
        if self.kv_te.get(te):
            self.kv_te[te] = 0
            lane = self.lane(te)
            lane.kv_t.append(t)
            lane.kv_used.append(0)

    def snapshot(self, actor: str, payload: bytes) -> None:
        try:
            head = _MASTER.decode(payload)
        except msgspec.DecodeError:
            return  # not a DP master's state
        if head.rtc is not None:
            self.capacity[actor] = array_len(head.rtc.ref)

    def control(self, t: float, actor: str, etype: str, d: dict[str, Any]) -> None:
        f = self.f
        key = (d["te"], int(d["generation"]))
        if etype == "TeLaunching":
            self.booting[key] = {"te": d["te"], "generation": key[1], "start_s": d["at_s"], "ready_s": None,
                                 "replacing": bool(d.get("replacing")) or key[1] > 1}  # fmt: skip
            self.lane(d["te"])
        elif etype == "TeReady":
            boot = self.booting.get(key)
            if boot is not None:
                boot["ready_s"] = d["at_s"]
            if key[1] > 1:
                f.faults.append({"t": t, "category": "recovered", "kind": "TeReady", "target": d["te"], "te": d["te"],
                                 "source": actor, "detail": f"generation {key[1]} ready (a replacement)"})  # fmt: skip
        elif etype == "TeDeclaredFailed":
            self.lost(t, d["te"])
            why = f" ({d['diagnosis']})" if d.get("diagnosis") else ""
            f.faults.append({"t": t, "category": "declared_failed", "kind": "TeDeclaredFailed", "target": d["te"],
                             "te": d["te"], "source": actor,
                             "detail": f"generation {key[1]} declared failed{why}: {d['reason']}"})  # fmt: skip


def _detail(fields: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fields.items())


def _request_row(done: dict[str, Any], f: Facts, je: str) -> dict[str, Any]:
    """A request's row: its terminal record and the latencies `deepserve sim` computes from it
    (actors/workload/metrics.py: TTFT with a first token, TPOT with at least two output tokens)."""
    arrival, first, finish, out = done["arrival_s"], done.get("first_token_s"), done["finish_s"], done["output_tokens"]
    completed = done["status"] == "completed"
    ttft = (first - arrival) * 1e3 if completed and first is not None else None
    tpot = (finish - first) * 1e3 / (out - 1) if ttft is not None and out >= 2 else None
    slo_met = ttft is not None and ttft <= f.slo_ttft_ms and (0.0 if out <= 1 else (tpot or 0.0)) <= f.slo_tpot_ms
    return {
        "request_id": done["request_id"], "status": done["status"], "reason": done["reason"], "je": je,
        "te": done.get("te", ""), "arrival_s": arrival, "first_token_s": first, "finish_s": finish,
        "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": (finish - arrival) * 1e3,
        "prompt_tokens": done["prompt_tokens"], "cached_prompt_tokens": done["cached_prompt_tokens"],
        "output_tokens": out, "preemptions": done.get("preemptions", 0), "slo_met": slo_met,
    }  # fmt: skip


def _decision_row(t: float, actor: str, d: dict[str, Any]) -> dict[str, Any]:
    dec = d["decision"]
    ranked = dec.get("ranked") or []
    return {
        "decision_id": d["task_id"], "t": t, "je": actor, "request_id": d["request_id"],
        "phase": d["phase"], "attempt": d["attempt"], "policy": dec["policy"], "chosen": dec.get("chosen", ""),
        "subgroup": dec.get("subgroup", ""), "candidates": len(ranked),
        "runner_up": ranked[1]["te"] if len(ranked) > 1 else "",
        "excluded": sum(len(e["tes"]) for e in dec.get("excluded") or ()), "reason": dec.get("reason", ""),
    }  # fmt: skip
