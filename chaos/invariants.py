"""The invariants a chaos run checks, after every simulated step and at its end.

- `terminal`: every accepted request reaches exactly one terminal state (one `RequestDone`
  reaches the client; none for a request never sent; none missing at the end); one that did
  not complete says why.
- `kv-blocks`: at every DP group, free + cached + referenced = capacity, each block in one of
  those, each block's reference count = the holders naming it (block tables, named caches,
  copies in flight), and every block table belongs to a task the master still tracks (a table
  left behind is a leak; a block freed twice shows as a count below its holders or a block
  both free and held). At the end, with every request terminal, no task is left on a master.
- `tokens`: each request's streamed tokens arrive in order from index 0, none twice, none
  skipped, and a completed request streamed exactly its output tokens.
- `migration`: a stream another task takes over (a migrated request resuming on another TE,
  a P/D decode after its prefill, a retry) has no duplicate and no missing token: the new task's
  first chunk starts at or below the client's next index (nothing skipped), the tokens it
  re-generates below that index are the ones the client has (compared by id: the frontend drops
  them, so any difference would reach the client as a token twice or one lost), and an older
  task's chunks after the takeover are dropped as the frontend drops them (actors/je/stream.py).
- `convergence`: once faults stop, every TE group is back to its target of ready TEs.
- `replay`: the run's log replays identically (replay.verify).

A checker is called by `SimDriver` after every delivery (`driver.invariants`); it looks only at
the actor just stepped (`driver.step_cell`), so a check costs that actor's state, not the
cluster's. The step number is the delivery's, counted from 1: re-running the seed reaches it
again at the same step.
"""

from __future__ import annotations

from collections import Counter, deque
from itertools import chain
from typing import Any

import msgspec

from deepserve.actors.flowserve.distflow.migrate import IMPORT_SEQ
from deepserve.actors.flowserve.master.state import MasterState
from deepserve.actors.flowserve.messages import TokenBatch
from deepserve.actors.flowserve.rtc.apply import is_rtc_event
from deepserve.actors.je.stream import task_order
from deepserve.actors.workload.messages import Arrive, RequestDone

INVARIANTS = ("terminal", "kv-blocks", "tokens", "migration", "convergence", "replay")
MAX_KEPT = 20  # violations kept per seed (the first one is the one reported)


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    invariant: str
    step: int  # the delivery after which it was seen (1-based); the last step for end checks
    t_s: float  # virtual time
    actor: str  # the actor stepped (or the one the end check names)
    detail: str


class Checker:
    """Per-step and end-of-run checks of one seed's run."""

    def __init__(self) -> None:
        self.step = 0
        self.violations: list[Violation] = []
        self.count = 0
        self.accepted: set[str] = set()  # requests injected
        self.done: dict[str, RequestDone] = {}
        self.streamed: dict[str, int] = {}  # request -> tokens streamed so far (next index)
        self.all_done = False
        self.late_chunks = 0  # chunks for requests already terminal (a client never sees them)
        self.follows: dict[str, tuple[str, tuple[int, int, int], int]] = {}  # request -> the task followed, its order
        self.ids: dict[str, list[int]] = {}  # request -> the token ids streamed (when the TEs send ids)
        self.taken_over: set[str] = set()  # requests whose stream another task took over mid-way
        self.superseded_chunks = 0  # an older task's chunks after a newer one took over (dropped)
        self._pending: list[tuple[str, str, str]] = []  # seen while routing a step's outputs

    # ---- wiring --------------------------------------------------------------------------
    def attach(self, driver: Any) -> None:
        """Check `driver` after each delivery and read what its actors send outside (before the
        run's own listener). The driver's own copy of those messages is turned off: the checker
        reads each one as it goes, and a copy would hold every token batch of the run."""
        driver.external_out = deque(maxlen=0)
        listen = driver.on_external

        def both(t: float, env: Any) -> None:
            if type(env.msg) is not Arrive:
                self.on_external(t, env)
                if listen is not None:
                    listen(t, env)

        driver.on_external = both
        driver.invariants.append(self)

    def __call__(self, driver: Any) -> None:
        """After each delivery: the outputs routed during it, then the actor just stepped."""
        self.step += 1
        cell = driver.step_cell
        if self._pending:
            for name, actor, detail in self._pending:
                self.report(name, driver.now, actor or cell.addr, detail)
            self._pending.clear()
        if self.all_done is False and len(self.done) >= len(self.accepted):
            # every request is terminal: the run's drain can stop (heartbeats would keep it going
            # for its next check, ~20,000 deliveries on), what comes next is the settle time
            self.all_done = driver.halt = True
        actor = cell.actor
        if actor is not None and type(actor.state) is MasterState and cell.ctx.events:
            full = any(map(is_rtc_event, cell.ctx.events))
            for detail in block_problems(actor.state, full):
                self.report("kv-blocks", driver.now, cell.addr, detail)

    def on_external(self, _t: float, env: Any) -> None:
        """What actors send outside, as the step sends it (SimDriver's `on_external`)."""
        msg = env.msg
        if type(msg) is TokenBatch:
            for chunk in msg.chunks:
                self._chunk(chunk.request_id, chunk.task_id, chunk.first_index, len(chunk.times_s), env.src,
                            chunk.token_ids)  # fmt: skip
        elif type(msg) is RequestDone:
            self._terminal(msg, env.src)

    def report(self, invariant: str, t_s: float, actor: str, detail: str, step: int | None = None) -> None:
        self.count += 1
        if len(self.violations) < MAX_KEPT:
            self.violations.append(Violation(invariant=invariant, step=self.step if step is None else step,
                                             t_s=round(t_s, 6), actor=actor, detail=detail))  # fmt: skip

    # ---- terminal states and tokens ------------------------------------------------------
    def _terminal(self, m: RequestDone, src: str) -> None:
        rid = m.request_id
        if rid not in self.accepted:
            self._pending.append(("terminal", src, f"{rid}: a terminal state for a request never sent"))
        elif rid in self.done:
            first = self.done[rid]
            self._pending.append(("terminal", src, f"{rid}: a second terminal state ({m.status}: {m.reason}) "
                                                   f"after {first.status}: {first.reason}"))  # fmt: skip
            return
        self.done[rid] = m
        self.ids.pop(rid, None)
        if m.status != "completed" and not m.reason.strip():
            self._pending.append(("terminal", src, f"{rid}: {m.status} without a reason"))
        n = self.streamed.get(rid, 0)
        if m.status == "completed" and n and n != m.output_tokens:
            self._pending.append(("tokens", src, f"{rid}: completed with {m.output_tokens} output tokens, "
                                                 f"{n} streamed"))  # fmt: skip

    def _chunk(self, rid: str, task_id: str, first: int, n: int, src: str, ids: tuple[int, ...] = ()) -> None:
        if rid in self.done:
            self.late_chunks += 1
            return
        expected = self.streamed.get(rid, 0)  # the client's next index
        task, order, own = self.follows.get(rid, ("", (-1, -1, -1), 0))  # `own`: the followed task's next
        if task_id != task:
            new = task_order(task_id)
            if task and new <= order:
                self.superseded_chunks += 1  # an older task, after a newer took over: dropped
                return
            if task and first > expected:
                self._pending.append(("migration", src, f"{rid}: {task_id} took the stream over at token {first} "
                                                        f"after {expected} streamed: tokens {expected}..{first - 1} "
                                                        "missing"))  # fmt: skip
            elif not task and first != expected:
                self._pending.append(("tokens", src, f"{rid}: tokens {first}..{first + n - 1} arrived after "
                                                     f"{expected} streamed: skipped"))  # fmt: skip
            task, own = task_id, first
            self.follows[rid] = (task_id, new, first)
        if first != own:  # within one task: every index once, in order
            what = "streamed twice" if first < own else "skipped"
            self._pending.append(("tokens", src, f"{rid}: tokens {first}..{first + n - 1} arrived after "
                                                 f"{max(own, expected)} streamed: {what}"))  # fmt: skip
        if first < expected:  # re-generated below the client's next index: dropped, so they must match
            self._regenerated(rid, task_id, first, ids[: expected - first], src)
        self.follows[rid] = (task, self.follows[rid][1], first + n)
        self._extend(rid, first, n, ids, expected)

    def _regenerated(self, rid: str, task_id: str, first: int, ids: tuple[int, ...], src: str) -> None:
        """A takeover's tokens below the client's next index must be the ones the client has."""
        self.taken_over.add(rid)
        have = self.ids.get(rid)
        if not ids or have is None:
            return
        bad = next((first + k for k, t in enumerate(ids) if first + k < len(have) and have[first + k] != t), None)
        if bad is not None:
            self._pending.append(("migration", src, f"{rid}: {task_id} re-sent token {bad} as {ids[bad - first]}, "
                                                    f"the client has {have[bad]} there: a duplicate or a lost token"))  # fmt: skip

    def _extend(self, rid: str, first: int, n: int, ids: tuple[int, ...], expected: int) -> None:
        self.streamed[rid] = max(expected, first + n)
        if ids:
            have = self.ids.setdefault(rid, [])
            if first + n > len(have) and first <= len(have):
                have.extend(ids[len(have) - first :])

    # ---- end of run ----------------------------------------------------------------------
    def at_end(self, driver: Any, groups: dict[str, int], manager: str) -> None:
        """Every request terminal, no task left on a master, every group at its target."""
        t = driver.now
        missing = sorted(self.accepted - set(self.done))
        if missing:
            self.report("terminal", t, "workload", f"{len(missing)} accepted requests never reached a "
                                                    f"terminal state (first: {missing[0]})")  # fmt: skip
        for addr in sorted(driver.cells):
            cell = driver.cells[addr]
            actor = cell.actor if cell.alive else None
            if actor is None or type(actor.state) is not MasterState:
                continue
            st = actor.state
            for detail in block_problems(st):
                self.report("kv-blocks", t, addr, detail)
            imports = [seq for seq in st.rtc.seqs if seq.startswith(IMPORT_SEQ)]
            if imports:
                self.report("kv-blocks", t, addr, f"{len(imports)} KV imports never ended (first: {imports[0]})")
            left = [tid for tid, r in st.reqs.items() if r.task.request_id in self.done]
            if left:
                held = sum(len(st.rtc.seqs[tid].blocks) for tid in left if tid in st.rtc.seqs)
                self.report("kv-blocks", t, addr, f"{len(left)} tasks of terminal requests still on the master, "
                                                  f"holding {held} blocks (first: {left[0]})")  # fmt: skip
        cell = driver.cells.get(manager)
        cm = cell.actor.state if cell is not None and cell.actor is not None else None
        for group, target in sorted(groups.items()):
            ready = sorted(te for te, r in (cm.tes.items() if cm is not None else ()) if r.group == group
                           and r.state == "ready")  # fmt: skip
            if len(ready) != target:
                states = Counter(r.state for r in cm.tes.values() if r.group == group) if cm is not None else {}
                self.report("convergence", t, manager, f"{group}: {len(ready)} of {target} TEs ready "
                                                       f"{WINDOW_NOTE} ({dict(states)})")  # fmt: skip


WINDOW_NOTE = "after the faults stopped and the settle time"


def block_problems(st: MasterState, full: bool = True) -> list[str]:
    """What is wrong with a DP master's KV block pool ([] when it adds up). The sums and the
    block tables' owners always; with `full` (the step changed the pool: an RTC event) each
    block's state and reference count too. C-level passes (`list.count`, `map`, `Counter`): a
    pool of 16-token blocks has ~20,000 of them, checked after many a step."""
    rtc = st.rtc
    cap = rtc.config.hbm_blocks
    ref, hashes = rtc.ref, rtc.hbm_hash
    free, lru, cold = rtc.free_hbm, rtc.lru_hbm, rtc.cold_hbm
    referenced = cap - ref.count(0)
    problems: list[str] = []
    total = len(free) + len(lru) + len(cold) + referenced
    if total != cap:
        problems.append(f"free {len(free)} + cached {len(lru) + len(cold)} + referenced {referenced} = "
                        f"{total}, capacity {cap}")  # fmt: skip
    # (PD: held for the D side; a KV import's blocks: its importer's while the bytes arrive, checked at the end)
    orphans = [tid for tid in rtc.seqs if tid not in st.reqs and tid not in st.held and not tid.startswith(IMPORT_SEQ)]
    if orphans:
        problems.append(f"block table of {orphans[0]} left behind: the master no longer tracks that task "
                        f"({len(rtc.seqs[orphans[0]].blocks)} blocks leaked)")  # fmt: skip
    if not full:
        return problems
    if len(set(free)) != len(free) or any(map(ref.__getitem__, free)) or \
            list(map(hashes.__getitem__, free)).count(None) != len(free):  # fmt: skip
        problems.append("a free block is free twice, referenced, or holds cached KV")
    cached = (*lru, *cold)
    if any(map(ref.__getitem__, cached)) or list(map(hashes.__getitem__, cached)).count(None):
        problems.append("a cached block is referenced or holds no KV")
    held = Counter(chain.from_iterable((*(sb.blocks for sb in rtc.seqs.values()),
                                        *(nc.blocks for nc in rtc.caches.values()),
                                        *(c.hbm for c in rtc.copies.values()))))  # fmt: skip
    wrong = next((b for b, n in held.items() if ref[b] != n), None)
    if wrong is None and sum(held.values()) != sum(ref):
        wrong = next(b for b in range(cap) if ref[b] != held.get(b, 0))
    if wrong is not None:
        n = held.get(wrong, 0)
        problems.append(f"block {wrong}: reference count {ref[wrong]}, {n} holders "
                        f"({'freed twice' if ref[wrong] < n else 'leaked'})")  # fmt: skip
    return problems
