"""SimDriver hands a page-storing sink its records as pages it encoded (`append_page`), in
delivery order, byte for byte what msgspec makes of the Steps; everything recorded is in the
sink whenever `run` returns or raises."""

from __future__ import annotations

import msgspec
import pytest
from kernel_actors import Add, AskIt, Counter, Forward

from deepserve.core import SimDriver
from deepserve.core.records import MemorySink, Step
from deepserve.core.sim import LOG_BATCH
from deepserve.persistence.pages import array_header


class PageSink(MemorySink):
    """A MemorySink that also stores pages (`append_page`), keeping each page's bytes and
    decoding its steps for the tests to read."""

    page_steps = LOG_BATCH

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.pages: list[bytes] = []

    def append_page(self, body: bytes | bytearray, steps: int, t_first: float, t_last: float) -> int:
        page = array_header(steps) + bytes(body)
        decoded = msgspec.msgpack.decode(page, type=list[Step])
        assert len(decoded) == steps
        assert (t_first, t_last) == (min(s.input.t for s in decoded), max(s.input.t for s in decoded))
        self.batches.append(steps)
        self.pages.append(page)
        self.steps.extend(decoded)
        return len(self.steps)


def _run(sink: MemorySink, forwards: int) -> SimDriver:
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    d.spawn("c/1", Counter)
    for i in range(forwards):
        d.inject("c/0", Forward("c/1", i), at=float(i))
    d.inject("c/1", Add(1), at=float(forwards))
    d.inject("c/0", AskIt("c/1", 5.0), at=float(forwards))  # two outputs: the ask, its timer
    d.run()
    return d


def test_batches_carry_the_same_records_in_the_same_order_as_appends() -> None:
    one_by_one, batched = MemorySink(), PageSink()
    _run(one_by_one, 1500)
    _run(batched, 1500)
    assert len(batched.steps) > 2 * LOG_BATCH
    assert msgspec.msgpack.encode(batched.steps) == msgspec.msgpack.encode(one_by_one.steps)
    # What the process writer stores: each page is what msgspec makes of that page's Steps.
    steps = iter(one_by_one.steps)
    for page, n in zip(batched.pages, batched.batches, strict=True):
        assert page == msgspec.msgpack.encode([next(steps) for _ in range(n)])
    assert batched.steps == one_by_one.steps
    assert any(len(s.outputs) == 2 for s in batched.steps) and any(s.events for s in batched.steps)
    assert any(s.snapshot is not None and s.input.kind == 0 for s in batched.steps)  # mid-run
    *full, last = batched.batches
    assert full and all(n == LOG_BATCH for n in full) and 0 < last <= LOG_BATCH


def test_records_are_in_the_sink_when_a_bounded_run_returns() -> None:
    sink = PageSink()
    d = SimDriver(seed=3, sink=sink)
    d.spawn("c/0", Counter)
    d.inject("c/0", Add(2), at=1.0)
    assert d.run(max_deliveries=1) == 1
    assert [s.input.type for s in sink.steps] == ["Started"]
    assert d.run() == 1  # the Add, then the run's end: every live actor's final state
    assert [s.input.type for s in sink.steps] == ["Started", "Add", ""]


def test_records_are_in_the_sink_when_the_run_raises() -> None:
    sink = PageSink()
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


@pytest.mark.parametrize("n", [1, 15, 16, 65535, 65536])
def test_a_page_header_is_msgpacks_own(n: int) -> None:
    assert msgspec.msgpack.encode([None] * n) == array_header(n) + b"\xc0" * n
