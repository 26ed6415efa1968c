"""A recorded run's external inputs and outcome, read off its log in one pass (issue 32 §1).

What came from outside — a client's `ApiRequest` (a simulation's `ext/client`, a daemon's
`ext/http`) with its arrival time and parameters, a fault (`ext/fault`: a scenario's plan), an
admin action (`ext/admin`: `deepserve fault`/`scale` on a daemon), a client's cancel
(`CancelJob`) — is all a re-simulation needs besides the config, which the log keeps too (the
run record's resolved config). Left out: the run's own end (`ext/operator`: the simulation's
drain or the daemon's shutdown, which a re-run makes for itself) and a daemon frontend's
`HeartbeatWake` (a simulated gateway wakes the monitor itself: cluster/assembly.py).

The same pass keeps what the original column of a what-if reports: every terminal record the
run sent outside (`RequestDone` and the gateway's `Refused` to `ext/metrics`), the events the
recovery report reads, the routing decisions (`decisions.py`), the step count and the clock at
the end. Times are the run's clock less its first step's (a daemon's wall clock starts at its
epoch second; a simulation's is 0 already), so a daemon incident lands in virtual time.

A daemon run directory of `--processes` holds one log per process: the gateway, the JEs and the
control plane — where every external input enters and every terminal record leaves — are in
`daemon.db`, which is read alone (the TE processes' logs hold what the daemon sent them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import msgspec

from deepserve.core.codec import DecodeError, decode
from deepserve.core.messages import Message
from deepserve.core.records import EventRec, InputRec, OutputRec, Step
from deepserve.persistence.api import LogError, LogReader

from .common import ReplayError, pick_run
from .decisions import DECISION_TYPES, Pending
from .state import _Fold

CLIENT_SOURCES = ("ext/client", "ext/http")
FAULT_SOURCES = ("ext/fault", "ext/admin")
SKIPPED_TYPES = frozenset({"HeartbeatWake"})  # a simulated gateway sends its own (module docstring)
METRICS_ADDR = "ext/metrics"
DAEMON_LOG = "daemon.db"
MANAGER_ADDR = "cluster"  # the cluster manager (cluster/assembly.py MANAGER_ADDR)  # the daemon's own log in its run directory (daemon/runtime.py LOG_FILE)


class Input(msgspec.Struct, frozen=True):
    """One recorded external input: at `t` (seconds since the run's start) to `actor`."""

    t: float
    actor: str
    src: str
    corr: str | None
    msg: Any  # the decoded message


class RunInputs(msgspec.Struct, kw_only=True):
    """What a what-if replays and what its original column reports."""

    path: str  # the log file read
    run_id: str
    mode: str  # "sim" | "daemon"
    config: dict[str, Any]  # the run's resolved config, as recorded
    t0: float  # the clock at the run's first step (subtracted from every time below)
    requests: list[Input]  # ApiRequests, in delivery order
    others: list[Input]  # faults, admin actions, cancels: every other external input kept
    terminal: list[tuple[float, Any]]  # (t, RequestDone | Refused) sent to ext/metrics, in log order
    recovery_events: list[tuple[float, str, Any]]
    decisions: dict[str, list[Pending]]  # per deciding actor, in its delivery order (decoded when compared)
    deliveries: int
    end_t: float  # the clock at the last step, less t0
    manager: Any = None  # the cluster manager's state at the end (None: the run had none)
    prefix: tuple[str, int] | None = None  # (hash, steps) of the steps up to `--from T` (`Prefix`)
    cut: Any = None  # `--from T`: the driver's image at T (replay/fork.py `Cut`), when read with one


def log_path(target: str) -> str:
    """The log to read: a file or URL as given; in a run directory, the daemon's own log when
    there is one (a `--processes` run: module docstring), else its only `*.db`."""
    if not os.path.isdir(target):
        return target
    own = os.path.join(target, DAEMON_LOG)
    if os.path.isfile(own):
        return own
    files = sorted(f for f in os.listdir(target) if f.endswith(".db"))
    if len(files) != 1:
        raise ReplayError(f"{target}: a what-if reads a daemon's run directory ({DAEMON_LOG}) or one log; "
                          f"this directory holds {len(files)} *.db files")  # fmt: skip
    return os.path.join(target, files[0])


def read_inputs(reader: LogReader, path: str, run_id: str | None = None, prefix_until_s: float | None = None,
                cut: Prefix | None = None) -> RunInputs:  # fmt: skip
    """One pass over the run's steps (module docstring); `cut` (replay/fork.py) sees the pages up to its time."""
    _load_types()
    from deepserve.actors.cluster.recovery_report import EVENT_TYPES

    run = pick_run(reader, run_id)
    try:
        config = json.loads(run.config) if run.config else {}
    except ValueError:
        raise ReplayError(f"{path}: run {run.run_id!r} has no readable config (its run record is damaged)") from None
    if not isinstance(config, dict) or "cluster" not in config:
        raise ReplayError(f"{path}: run {run.run_id!r} is not a platform run (its config has no [cluster]): "
                          "a what-if re-simulates a `deepserve sim` or `deepserve up` run")  # fmt: skip
    sch = config.get("scheduling", {})  # (the dispatcher's run records none)
    if sch is None or sch.get("entry") == "dispatcher" or "partition" in config:
        raise ReplayError(f"{path}: run {run.run_id!r} ran behind the workload dispatcher (no gateway, JE nor control "
                          "plane: `scheduling.entry = \"dispatcher\"` or a `--workers` split): a what-if re-simulates "
                          "the platform's runs")  # fmt: skip
    out = RunInputs(path=path, run_id=run.run_id, mode=run.mode, config=config, t0=0.0, requests=[], others=[],
                    terminal=[], recovery_events=[], decisions={}, deliveries=0, end_t=0.0)  # fmt: skip
    t0: float | None = None
    t = 0.0
    # the recovery report's events: its lines are per `[[faults]]` entry (none: none read)
    recovery = EVENT_TYPES if config.get("faults") else frozenset()
    manager = _Fold()  # the cluster manager's state, folded from its events (replay/state.py)
    prefix = cut if cut is not None else Prefix(prefix_until_s) if prefix_until_s is not None else None
    if prefix is not None and run.mode != "sim":
        raise ReplayError("--from needs a simulation's log: a daemon's wall-clock run is not re-run step for step "
                          "(its what-if from the start says how far its virtual re-run agrees)")  # fmt: skip
    for inp, events, outputs in _steps(reader, run.run_id, DECISION_TYPES | recovery, prefix):
        if inp.actor == MANAGER_ADDR and inp.seq >= 0:
            _fold(manager, inp, events)
        if t0 is None:
            t0 = inp.t if run.mode != "sim" else 0.0
        t = inp.t - t0
        if inp.seq >= 0:
            out.deliveries += 1
        if inp.src.startswith("ext/"):
            _keep_input(out, inp, t)
        for ev in events():
            if ev.type in recovery:
                out.recovery_events.append((t, inp.actor, _decode(ev.type, ev.payload)))
            if ev.type in DECISION_TYPES:
                out.decisions.setdefault(inp.actor, []).append(Pending(t, inp.actor, inp.seq, ev.type, ev.payload))
        for o in outputs():
            if o.dst == METRICS_ADDR and o.type:
                out.terminal.append((t, _decode(o.type, o.payload)))
    out.t0, out.end_t = t0 or 0.0, t
    out.manager = manager.state
    if prefix is not None:
        out.prefix = (prefix.h.hexdigest(), prefix.steps)
    out.cut = cut
    return out


def _fold(fold: _Fold, inp: InputRec, events: Callable[[], Iterable[EventRec]]) -> None:
    step = Step(inp, tuple(events()), ())
    if inp.type == "Started":  # a spawn or a restart: start over
        fold.start(step, decode("Started", inp.payload))  # type: ignore[arg-type]
    if fold.actor is not None:
        fold.apply(step)


class _LightStep(msgspec.Struct, array_like=True, gc=False):
    # A logged step with its events and outputs left as bytes until asked for (pages.py's
    # `_StepSnapshot` does the same for snapshots): most of a run's steps are the TEs' and the
    # NPUs', whose events and outputs a what-if never reads.
    input: InputRec
    events: msgspec.Raw
    outputs: msgspec.Raw
    snapshot: Any = None  # (few steps have one; Raw cannot be optional)


_LIGHT = msgspec.msgpack.Decoder(list[_LightStep])
_RAWS = msgspec.msgpack.Decoder(list[msgspec.Raw])  # each step's bytes, as stored
_EVENTS = msgspec.msgpack.Decoder(tuple[EventRec, ...])
_OUTPUTS = msgspec.msgpack.Decoder(tuple[OutputRec, ...])
Steps = Iterator[tuple[InputRec, Callable[[], Iterable[EventRec]], Callable[[], Iterable[OutputRec]]]]


class Prefix:
    """The hash of a run's steps up to `until_s`, each as the log stores it (`--from T`: the
    re-run up to T must hash the same, cluster/whatif_fork.py)."""

    def __init__(self, until_s: float) -> None:
        self.until_s = until_s
        self.h = hashlib.blake2b(digest_size=32)
        self.steps = 0
        self.done = False

    def page(self, light: list[_LightStep], body: bytes) -> None:
        for st, raw in zip(light, _RAWS.decode(body), strict=True):
            if st.input.t > self.until_s:
                self.done = True
                return
            self.h.update(raw)
            self.steps += 1


def _steps(reader: LogReader, run_id: str, event_types: frozenset[str], prefix: Prefix | None = None) -> Steps:
    """(input, its events, its outputs) per step, in log order; events and outputs as thunks. A
    paged SQLite log's steps are decoded only as far as needed: events when their bytes name one
    of `event_types` (the cluster manager's always: its state is folded), outputs when theirs name `ext/metrics` (other logs: whole steps)."""
    from deepserve.persistence.pages import checked_body

    bodies = getattr(reader, "page_bodies", None)
    if bodies is None or not reader.is_paged(run_id):  # type: ignore[attr-defined]
        if prefix is not None:
            raise ReplayError(f"--from needs a paged SQLite log (what `deepserve sim` writes); {reader.label} is not one")
        for step in reader.steps(run_id):
            yield step.input, partial(tuple, step.events), partial(tuple, step.outputs)
        return
    label = getattr(reader, "label", "log")
    named = re.compile(b"|".join(re.escape(n.encode()) for n in sorted(event_types))).search
    metrics = re.compile(re.escape(METRICS_ADDR.encode())).search
    for page in bodies(run_id):
        try:
            body = checked_body(label, run_id, page)
            light = _LIGHT.decode(body)
            if prefix is not None and not prefix.done:
                prefix.page(light, body)
        except msgspec.DecodeError as exc:
            raise LogError(f"{label}: damaged log: page {page[0]} of run {run_id!r} does not decode ({exc})") from None
        for st in light:
            evs, outs = memoryview(st.events), memoryview(st.outputs)
            yield (st.input,
                   partial(_EVENTS.decode, evs) if named(evs) or st.input.actor == MANAGER_ADDR else _nothing,
                   partial(_OUTPUTS.decode, outs) if metrics(outs) else _nothing)  # fmt: skip


def _nothing() -> tuple[()]:
    return ()


def _keep_input(out: RunInputs, inp: Any, t: float) -> None:
    if inp.type in SKIPPED_TYPES or inp.src == "ext/operator":
        return
    if inp.src in CLIENT_SOURCES and inp.type == "ApiRequest":
        out.requests.append(Input(t, inp.actor, inp.src, inp.corr, _decode(inp.type, inp.payload)))
    elif inp.src in FAULT_SOURCES or inp.src in CLIENT_SOURCES:
        out.others.append(Input(t, inp.actor, inp.src, inp.corr, _decode(inp.type, inp.payload)))


def _decode(type_name: str, payload: bytes) -> Message:
    try:
        return decode(type_name, payload)
    except DecodeError as exc:
        raise ReplayError(f"a recorded {type_name} cannot be decoded: {exc}") from None


def _load_types() -> None:
    """Register the message and event classes by importing their modules (decode works by type name)."""
    from .why import _load_types as load

    load()
    import deepserve.actors.cluster.heartbeat  # noqa: F401
    import deepserve.actors.cluster.messages  # noqa: F401
    import deepserve.actors.je.messages  # noqa: F401


def open_run(target: str, run_id: str | None = None, prefix_until_s: float | None = None,
             cut: Prefix | None = None) -> RunInputs:  # fmt: skip
    """Open `target` (a log file, URL or run directory) read-only and read its inputs."""
    from deepserve.persistence import open_log

    path = log_path(target)
    try:
        reader = open_log(path, upgrade=False)
    except LogError as exc:
        raise ReplayError(f"{target}: {exc}") from None
    try:
        reader.check_integrity()
        out = read_inputs(reader, path, run_id, prefix_until_s, cut)
        return out
    finally:
        reader.close()
