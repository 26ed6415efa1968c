"""SimDriver hands its records to the sink in batches of rows (`append_rows`), in delivery
order; a row encodes byte for byte as its Step; everything recorded is in the sink whenever
`run` returns or raises."""

from __future__ import annotations

import msgspec
import pytest
from kernel_actors import Add, Counter, Forward

from deepserve.core import SimDriver
from deepserve.core.records import MemorySink, StepRow
from deepserve.core.sim import LOG_BATCH
from deepserve.core.steps import step_from_row, step_row


class BatchSink(MemorySink):
    """A MemorySink that also takes batches of rows, and keeps them as they came."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.rows: list[StepRow] = []

    def append_rows(self, rows: list[StepRow]) -> int:
        assert all(type(r) is tuple for r in rows)
        self.batches.append(len(rows))
        self.rows.extend(rows)
        self.steps.extend(step_from_row(r) for r in rows)
        return len(self.steps)


def _run(sink: MemorySink, forwards: int) -> SimDriver:
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    for i in range(forwards):
        d.inject("c/0", Forward("c/1", i), at=float(i))
    d.inject("c/1", Add(1), at=float(forwards))
    d.run()
    return d


def test_batches_carry_the_same_records_in_the_same_order_as_appends() -> None:
    one_by_one, batched = MemorySink(), BatchSink()
    _run(one_by_one, 1500)
    _run(batched, 1500)
    assert len(batched.steps) > 2 * LOG_BATCH
    assert msgspec.msgpack.encode(batched.steps) == msgspec.msgpack.encode(one_by_one.steps)
    # What the process writer stores: the rows' own encoding, the same bytes as the Steps'.
    assert msgspec.msgpack.encode(batched.rows) == msgspec.msgpack.encode(one_by_one.steps)
    assert batched.steps == one_by_one.steps
    *full, last = batched.batches
    assert full and all(n == LOG_BATCH for n in full) and 0 < last <= LOG_BATCH


def test_records_are_in_the_sink_when_a_bounded_run_returns() -> None:
    sink = BatchSink()
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    d.inject("c/0", Add(2), at=1.0)
    assert d.run(max_deliveries=1) == 1
    assert [s.input.type for s in sink.steps] == ["Started"]
    assert d.run() == 1  # the Add, then the run's end: every live actor's final state
    assert [s.input.type for s in sink.steps] == ["Started", "Add", ""]


def test_records_are_in_the_sink_when_the_run_raises() -> None:
    sink = BatchSink()
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    for i in range(5):
        d.inject("c/0", Add(1), at=float(i))

    def below_three(driver: SimDriver) -> None:
        assert driver.actor("c/0").state.total < 3, "total reached 3"

    d.invariants.append(below_three)
    with pytest.raises(AssertionError, match="total reached 3"):
        d.run()
    assert [s.input.type for s in sink.steps] == ["Started", "Add", "Add", "Add"]


def test_a_step_and_its_row_convert_both_ways() -> None:
    sink = MemorySink()
    d = _run(sink, 3)
    d.snapshot_live()
    snapped = [s for s in sink.steps if s.snapshot is not None]
    assert snapped and any(s.outputs for s in sink.steps) and any(s.events for s in sink.steps)
    for step in sink.steps:
        row = step_row(step)
        assert step_from_row(row) == step
        assert msgspec.msgpack.encode(row) == msgspec.msgpack.encode(step)
