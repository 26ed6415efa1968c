"""The replay API on in-memory logs: verify, state_at, listing, digest."""

from __future__ import annotations

import msgspec
import pytest

from deepserve.benchmarks.replay_workload import measure_verify
from deepserve.core import Actor, Context, Event, HandlerFailed, Message, SimDriver
from deepserve.core.records import EventRec, InputKind, InputRec, MemorySink, OutputRec, Step
from deepserve.examples.pipeline import DispatchState, run_scenario
from deepserve.persistence.api import MemoryLog
from deepserve.replay import ReplayError, digest, listing, listing_records, state_at, verify


@pytest.fixture(scope="module")
def example() -> MemorySink:
    sink = MemorySink()
    run_scenario(4, sink, 60)
    return sink


def _copy(sink: MemorySink) -> MemorySink:
    """A deep copy, so a test can tamper with it."""
    out = MemorySink()
    out.runs = list(sink.runs)
    out.steps = msgspec.msgpack.decode(msgspec.msgpack.encode(sink.steps), type=list[Step])
    return out


def test_example_verifies(example: MemorySink) -> None:
    result = verify(MemoryLog(example))
    assert result.identical and result.divergence is None
    assert result.actors == 6
    assert result.inputs == sum(1 for s in example.steps if s.input.seq >= 0)
    run_id = example.runs[-1].run_id
    assert result.summary() == f"identical: 6 actors, {result.inputs} inputs (run {run_id!r})"


def test_missing_output_and_changed_input_are_reported_precisely(example: MemorySink) -> None:
    sink = _copy(example)
    k = next(i for i, s in enumerate(sink.steps) if s.input.type == "RunJob" and s.outputs)
    step = sink.steps[k]
    sink.steps[k] = Step(step.input, step.events, step.outputs[:-1], step.snapshot)
    d = verify(MemoryLog(sink)).divergence
    assert d is not None and (d.actor, d.seq) == (step.input.actor, step.input.seq)
    assert d.what == f"output {len(step.outputs) - 1}"
    assert d.expected is None and d.actual["kind"] == "timer"
    assert d.input["type"] == "RunJob" and d.input["payload"]["job"].startswith("job-")


def test_tracebacks_are_not_behaviour(example: MemorySink) -> None:
    """A HandlerFailed logged on another machine has other paths in its traceback."""
    sink = _copy(example)
    for i, step in enumerate(sink.steps):
        events = list(step.events)
        for j, ev in enumerate(events):
            if ev.type == "HandlerFailed":
                hf = msgspec.msgpack.decode(ev.payload, type=HandlerFailed)
                moved = HandlerFailed(error=hf.error, traceback="File /elsewhere/x.py, line 1")
                events[j] = EventRec(ev.actor, ev.seq, ev.idx, ev.type, msgspec.msgpack.encode(moved))
        sink.steps[i] = Step(step.input, events, step.outputs, step.snapshot)
    assert any(e.type == "HandlerFailed" for s in sink.steps for e in s.events)
    assert verify(MemoryLog(sink)).identical
    assert digest(MemoryLog(sink)) == digest(MemoryLog(example))


def test_digest_ignores_run_identity_but_not_content(example: MemorySink) -> None:
    other = _copy(example)
    r = other.runs[0]
    other.runs = [msgspec.structs.replace(r, run_id="elsewhere", host="h2", started_at=1.0)]
    assert digest(MemoryLog(other)) == digest(MemoryLog(example))
    last = other.steps[-1]
    i = last.input
    other.steps[-1] = Step(msgspec.structs.replace(i, t=i.t + 1e-9), last.events, last.outputs)
    assert digest(MemoryLog(other)) != digest(MemoryLog(example))


def test_state_at_folds_events_up_to_a_time(example: MemorySink) -> None:
    log = MemoryLog(example)
    final = state_at(log, "dispatch")
    assert isinstance(final.state, DispatchState) and final.state.done == 60 and final.alive
    early = state_at(log, "dispatch", at=5.0)
    assert early.t <= 5.0 and early.seq < final.seq and early.state.done < 60
    assert state_at(log, "dispatch", at=0.0).state.workers == ["worker/0", "worker/1", "worker/2", "worker/3"]
    retired = state_at(log, "worker/0")
    assert not retired.alive
    with pytest.raises(ReplayError, match="no actor 'nobody'"):
        state_at(log, "nobody")


def test_listing_lines_and_records(example: MemorySink) -> None:
    log = MemoryLog(example)
    lines = list(listing(log, corr="job-3"))
    heads = [line for line in lines if not line.startswith(" " * 16)]
    assert heads[0].split()[1].startswith("dispatch#")
    assert "ext/client→dispatch  SubmitJob" in heads[0] and heads[0].endswith("corr=job-3")
    assert any(line.strip().startswith("event   JobQueued") for line in lines)
    assert any(line.strip().startswith("timer   +8s key=job:job-3 JobTimeout") for line in lines)
    rows = list(listing_records(log, actor="worker/1", since=2.0, until=6.0))
    assert rows and all(r["actor"] == "worker/1" and 2.0 <= r["t"] <= 6.0 for r in rows)


class Nap(Message, frozen=True):
    pass


class Napped(Event, frozen=True):
    pass


class Napper(Actor[int]):
    def initial_state(self) -> int:
        return 0

    def evolve(self, state: int, event: Event) -> int:
        return state + 1

    def handle(self, ctx: Context, msg: Message) -> None:
        ctx.record(Napped())


def test_log_problems_are_replay_errors() -> None:
    sink = MemorySink()
    driver = SimDriver(0, sink=sink)
    driver.spawn("napper", Napper)
    driver.inject("napper", Nap(), at=1.0)
    driver.inject("nobody", Nap(), at=2.0)  # a dead letter: listed, never replayed
    driver.run()
    assert verify(MemoryLog(sink)).inputs == 2
    assert "napper#dead" not in "\n".join(listing(MemoryLog(sink)))
    assert "nobody#dead" in "\n".join(listing(MemoryLog(sink)))

    gap = MemorySink()
    gap.runs, gap.steps = sink.runs, [sink.steps[0], *sink.steps[2:]]
    later = _shift(sink.steps[1], 5)
    gap.steps.insert(1, later)
    with pytest.raises(ReplayError, match=r"napper#7: inputs are not consecutive \(previous was #1\)"):
        verify(MemoryLog(gap))
    headless = MemorySink()
    headless.runs, headless.steps = sink.runs, sink.steps[1:]
    with pytest.raises(ReplayError, match="napper#2: first logged input is Nap, not Started"):
        verify(MemoryLog(headless))
    with pytest.raises(ReplayError, match="the log holds no run"):
        verify(MemoryLog(MemorySink()))


def _shift(step: Step, by: int) -> Step:
    i: InputRec = step.input
    outs: list[OutputRec] = step.outputs
    return Step(msgspec.structs.replace(i, seq=i.seq + by), step.events, outs)


def test_measure_verify_reports_throughput() -> None:
    m = measure_verify(5_000)
    assert m["inputs"] >= 4_000 and m["inputs_per_s"] > 0


def test_a_file_log_reads_back_with_the_same_digest(example: MemorySink, tmp_path) -> None:
    """Through the SQLite store and back: same content, still verifies."""
    from deepserve.persistence import open_log, open_sink

    path = str(tmp_path / "copy.db")
    sink = open_sink(path, "async")
    sink.begin_run(example.runs[0])
    for step in example.steps:
        sink.append(step)
    sink.close()
    log = open_log(path)
    assert digest(log) == digest(MemoryLog(example))
    assert verify(log).identical
    assert state_at(log, "dispatch").state == state_at(MemoryLog(example), "dispatch").state


@pytest.mark.parametrize(
    ("kind", "label"),
    [
        (InputKind.DEAD, "(dead letter)"),
        (InputKind.FULL, "(dropped: mailbox full)"),
        (InputKind.SNAPSHOT, "(final state: snapshot at run end or stop)"),
        (InputKind.LATE, "(late answer: its ask had already settled, not delivered)"),
    ],
)
def test_listing_labels_every_input_kind(kind: InputKind, label: str) -> None:
    """Each kind of non-delivered input gets its own note, in text and `--json`: a
    snapshot or a late answer is not a drop at a full mailbox."""
    sink = MemorySink()
    driver = SimDriver(0, sink=sink)
    driver.spawn("napper", Napper)
    driver.inject("nobody", Nap(), at=2.0)
    driver.run()
    i = next(n for n, s in enumerate(sink.steps) if s.input.actor == "nobody")
    sink.steps[i].input = msgspec.structs.replace(sink.steps[i].input, kind=int(kind))
    line = next(x for x in listing(MemoryLog(sink)) if x.split()[1].startswith("nobody#"))
    assert line.endswith(label)
    row = next(r for r in listing_records(MemoryLog(sink)) if r["actor"] == "nobody")
    assert (row["kind"], row["label"]) == (kind.name.lower(), label[1:-1])
    delivered = next(r for r in listing_records(MemoryLog(sink)) if r["kind"] == "deliver")
    assert "label" not in delivered


def test_an_absent_corr_lists_the_first_ones_without_inventing_a_count(example: MemorySink) -> None:
    """The listing stops reading at the ninth distinct id: it cannot say how many more."""
    from deepserve.replay.listings import check_filters

    log = MemoryLog(example)
    with pytest.raises(ReplayError) as info:
        check_filters(log, corr="nope")
    first = list(dict.fromkeys(s.input.corr for s in example.steps if s.input.corr))[:8]
    assert str(info.value).endswith(f"(correlation ids: {', '.join(first)}, … and more)")
    few = MemorySink()
    few.runs = list(example.runs)
    few.steps = [s for s in example.steps if s.input.corr in (None, "job-0", "job-1")]
    with pytest.raises(ReplayError) as info:
        check_filters(MemoryLog(few), corr="nope")
    assert str(info.value).endswith("(correlation ids: job-0, job-1)")
