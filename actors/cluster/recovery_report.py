"""Recovery accounting (issue 31 §2): per scheduled fault, when the control plane noticed it and
why (the recorded diagnosis: device lost vs hang vs silent vs exited), when the TE served again,
and the requests it touched — a pure function over the run's recorded events, so `sim` prints it
at the end of a run and `replay` can print it for any recorded log, the daemon's included.

    report = recovery_report(faults, recovery_events(steps), npus_of)
    report.faults_injected, report.recoveries, report.tes_ready_at_end, report.tes_target
    for line in report.lines: print(line.text())

- `faults`: the scenario's `[[faults]]` (anything with `at_s`, `kind`, `target`), in plan order;
- `recovery_events(steps)`: (t, actor, event) of the events this report reads, decoded from a
  log's steps (each with `.input.t`, `.input.actor` and `.events` of `.type` / `.payload`: a
  `MemorySink`'s or a log reader's). Only the types in `EVENT_TYPES` are decoded;
- `npus_of`: TE address -> its NPUs (the TE slots'), to name the TE an NPU fault hits.

A fault's window on its TE runs from its time to the next fault on the same TE. Inside it:
detected = the first `TeDeclaredFailed` of that TE; recovered = the first `TeReady` of a later
generation; affected requests = the TE's tasks that ended failed up to the detection (after it,
nothing more is routed there): `retried` if their job went on, `failed` if the job failed with
them. Under restart-the-world (`WorldRestarted`) every TE it stopped counts, until the last of them
is ready again, and so do the requests that failed meanwhile for want of a TE. A `kill-je` is noticed by the gateway (`GatewayJeDown`), its jobs retried or failed there.
A link fault fails transfers, not TEs: its requests are the tasks whose failure names the link;
it is detected by the first link-probe verdict naming it (`LinkDiagnosed`), if probing is on. Repairs (`npu-reset`, `link-up`)
are listed and counted as injected inputs, with nothing to detect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import msgspec

from deepserve.actors.flowserve.distflow.probe import LinkDiagnosed
from deepserve.actors.gateway.messages import GatewayJeDown
from deepserve.actors.je.messages import JeTaskEnded, JobFinished
from deepserve.core.codec import decode

from .ladder_state import TeScaledIn, WorldRestarted
from .state import GroupTarget, TeDeclaredFailed, TeReady, TeStopped

EVENT_TYPES = frozenset(c.__name__ for c in (TeDeclaredFailed, TeReady, TeStopped, GroupTarget, JeTaskEnded,
                                              JobFinished, GatewayJeDown, TeScaledIn, WorldRestarted,
                                              LinkDiagnosed))  # fmt: skip
REPAIRS = ("npu-reset", "link-up")
LINK_KINDS = ("link-down", "link-degrade", "link-flap")


class FaultLike(Protocol):
    at_s: float
    kind: str
    target: str


class FaultLine(msgspec.Struct, frozen=True, kw_only=True):
    kind: str
    target: str
    at_s: float
    te: str = ""  # the TE it hit ("" for a JE or a link)
    detected_after_s: float | None = None
    diagnosis: str = ""  # the manager's recorded diagnosis (or "gateway" for a lost JE)
    recovered_after_s: float | None = None  # the TE (a later generation) ready again
    failed: int = 0  # requests that failed because of it
    retried: int = 0  # requests whose task it failed, run again elsewhere

    def text(self) -> str:
        what = f"{self.kind} {self.target}" + (f" ({self.te})" if self.te and self.te != self.target else "")
        if self.kind in REPAIRS:
            return f"fault at {self.at_s:g} s: {what}: a repair"
        seen = ("not detected" if self.detected_after_s is None else
                f"detected after {self.detected_after_s:.3g} s ({self.diagnosis})")  # fmt: skip
        back = "" if self.recovered_after_s is None else f", recovered after {self.recovered_after_s:.3g} s"
        if self.detected_after_s is not None and self.recovered_after_s is None and self.te:
            back = ", not recovered"
        return f"fault at {self.at_s:g} s: {what}: {seen}{back}; requests: {self.failed} failed, {self.retried} retried"


class RecoveryReport(msgspec.Struct, frozen=True, kw_only=True):
    lines: tuple[FaultLine, ...]
    faults_injected: int
    recoveries: int  # TE failures followed by a later generation ready
    tes_ready_at_end: int
    tes_target: int  # the groups' target sizes at the end, summed


def recovery_events(steps: Iterable[Any]) -> list[tuple[float, str, Any]]:
    """The (t, actor, event) this report reads, from a log's steps, in log order."""
    out = []
    for step in steps:
        for ev in step.events:
            if ev.type in EVENT_TYPES:
                out.append((step.input.t, step.input.actor, decode(ev.type, ev.payload)))
    return out


def recovery_report(faults: Sequence[FaultLike], events: Iterable[tuple[float, str, Any]],
                    npus_of: Mapping[str, Sequence[str]], until_s: float | None = None) -> RecoveryReport:  # fmt: skip
    """See the module docstring. `until_s`: the run's end (faults after it were never injected)."""
    evs = list(events)
    te_of_npu = {npu: te for te, npus in npus_of.items() for npu in npus}
    injected = [f for f in faults if until_s is None or f.at_s <= until_s]
    hit = [f.target if f.target in npus_of else te_of_npu.get(f.target, "") for f in injected]
    lines = []
    for i, f in enumerate(injected):
        te = hit[i]
        later = [g.at_s for g, t in zip(injected[i + 1:], hit[i + 1:], strict=True) if te and t == te and g.at_s > f.at_s]
        end_s = min(later, default=float("inf"))
        if f.kind in REPAIRS:
            lines.append(FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, te=te))
        elif f.kind == "kill-je":
            lines.append(_je_line(f, evs))
        elif f.kind in LINK_KINDS:
            lines.append(_link_line(f, evs))
        else:
            lines.append(_te_line(f, te, end_s, evs))
    return RecoveryReport(lines=tuple(lines), faults_injected=len(injected), recoveries=_recoveries(evs),
                          tes_ready_at_end=_ready_at_end(evs), tes_target=_target(evs))  # fmt: skip


def _te_line(f: FaultLike, te: str, end_s: float, evs: list[tuple[float, str, Any]]) -> FaultLine:
    declared = next(((t, e) for t, _, e in evs if type(e) in (TeDeclaredFailed, TeScaledIn) and e.te == te
                      and f.at_s <= t < end_s), None)  # fmt: skip
    if declared is None:
        return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, te=te)
    if type(declared[1]) is TeScaledIn:  # the recovery ladder's vertical scaling: the TE serves on
        t_in, e_in = declared
        failed, retried = _requests(evs, lambda e: e.te == te, f.at_s, t_in)
        return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, te=te, detected_after_s=t_in - f.at_s,
                         diagnosis=f"scaled in: dp/{e_in.dp} dropped, {e_in.dps_left} left", failed=failed,
                         retried=retried, recovered_after_s=t_in - f.at_s)  # it serves on at once  # fmt: skip
    t_fail, e_fail = declared
    ready = next((t for t, _, e in evs if type(e) is TeReady and e.te == te and e.generation > e_fail.generation
                  and t >= t_fail), None)  # fmt: skip
    world = next((e for t, _, e in evs if type(e) is WorldRestarted and e.failed == te and t >= t_fail), None)
    if world is not None:  # restart-the-world: every TE it stopped, until the last is back
        failed, retried = _world_requests(evs, world, f.at_s, t_fail)
    else:
        failed, retried = _requests(evs, lambda e: e.te == te, f.at_s, t_fail)
    return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, te=te, detected_after_s=t_fail - f.at_s,
                     diagnosis=e_fail.diagnosis, recovered_after_s=None if ready is None else ready - f.at_s,
                     failed=failed, retried=retried)  # fmt: skip


def _je_line(f: FaultLike, evs: list[tuple[float, str, Any]]) -> FaultLine:
    down = next(((t, e) for t, _, e in evs if type(e) is GatewayJeDown and e.je == f.target and t >= f.at_s), None)
    if down is None:
        return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s)
    t, e = down
    return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, detected_after_s=t - f.at_s, diagnosis="gateway",
                     failed=len(e.failed), retried=len(e.retried))  # fmt: skip


def _link_line(f: FaultLike, evs: list[tuple[float, str, Any]]) -> FaultLine:
    failed, retried = _requests(evs, lambda e: f.target in e.reason, f.at_s, float("inf"))
    # with link probing, the first verdict naming the link detects it (distflow/probe.py)
    seen = next((e for t, _, e in evs if type(e) is LinkDiagnosed and e.link == f.target and t >= f.at_s), None)
    return FaultLine(kind=f.kind, target=f.target, at_s=f.at_s, failed=failed, retried=retried,
                     detected_after_s=None if seen is None else seen.detected_s - f.at_s,
                     diagnosis="" if seen is None else seen.verdict)  # fmt: skip


def _requests(evs: list[tuple[float, str, Any]], mine: Any, from_s: float, to_s: float) -> tuple[int, int]:
    """(failed, retried): requests with a task that ended failed in [from_s, to_s] and matched."""
    hit = {e.request_id for t, _, e in evs
           if type(e) is JeTaskEnded and e.status == "failed" and from_s <= t <= to_s and mine(e)}  # fmt: skip
    failed = {e.done.request_id for _, _, e in evs if type(e) is JobFinished and e.done.status == "failed"}
    return len(hit & failed), len(hit - failed)


def _world_requests(evs: list[tuple[float, str, Any]], world: WorldRestarted, from_s: float,
                    t_fail: float) -> tuple[int, int]:  # fmt: skip
    """(failed, retried) of a restart-the-world: the requests with a task that failed on any TE it
    stopped, from the fault until every one of them is ready again (a prefill left down for want of
    NPUs: until the run's end), and those that failed meanwhile with no task failing (nothing to
    route to: parked until their deadline)."""
    stopped = set(world.stopped)
    back = {e.te: t for t, _, e in reversed(evs) if type(e) is TeReady and e.te in stopped and t >= t_fail}
    to_s = max(back.values()) if len(back) == len(stopped) else float("inf")
    hit = {e.request_id for t, _, e in evs if type(e) is JeTaskEnded and e.status == "failed"
           and from_s <= t <= to_s and e.te in stopped}  # fmt: skip
    failed = {e.done.request_id for _, _, e in evs if type(e) is JobFinished and e.done.status == "failed"}
    stranded = {e.done.request_id for t, _, e in evs if type(e) is JobFinished and e.done.status == "failed"
                and t_fail <= t <= to_s}  # fmt: skip
    return len((hit & failed) | stranded), len(hit - failed)


def _recoveries(evs: list[tuple[float, str, Any]]) -> int:
    failed_gen: dict[str, int] = {}
    n = 0
    for _, _, e in evs:
        if type(e) is TeDeclaredFailed:
            failed_gen.setdefault(e.te, e.generation)
        elif type(e) is TeReady and e.te in failed_gen and e.generation > failed_gen[e.te]:
            n += 1
            del failed_gen[e.te]
    return n


def _ready_at_end(evs: list[tuple[float, str, Any]]) -> int:
    state: dict[str, bool] = {}
    for _, _, e in evs:
        if type(e) is TeReady:
            state[e.te] = True
        elif type(e) in (TeDeclaredFailed, TeStopped):
            state[e.te] = False
    return sum(state.values())


def _target(evs: list[tuple[float, str, Any]]) -> int:
    sizes = {e.group: e.size for _, _, e in evs if type(e) is GroupTarget}
    return sum(sizes.values())
