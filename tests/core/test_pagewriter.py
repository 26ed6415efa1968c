"""`core/pagewriter.py` writes msgpack as msgspec does: value by value at every length and range
boundary, and step by step against the `Step`s and rows of the same deliveries."""

from __future__ import annotations

import itertools
import math
import random

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kernel_actors import Add, Counter
from librt.strings import BytesWriter
from netactors import random_network, run_network
from test_sim_log_batches import PageSink

from deepserve.core import pagewriter as pw
from deepserve.core.cell import Cell, execute
from deepserve.core.classpath import class_path
from deepserve.core.context import Out
from deepserve.core.envelope import Envelope
from deepserve.core.messages import Started
from deepserve.core.records import MemorySink, Step
from deepserve.core.steps import make_row, make_step

_msgpack = msgspec.msgpack.encode
INT_EDGES = [0, 1, 31, 32, 127, 128, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 2**31 - 1, 2**31,
             2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
LENGTHS = [0, 1, 15, 16, 31, 32, 255, 256, 0x7FFF, 0x8000, 0xFFFF, 0x10000]


def _written(write, value) -> bytes:  # noqa: ANN001 — any of the module's writers
    w = BytesWriter()
    write(w, value)
    return w.getvalue()


@pytest.mark.parametrize("x", [*INT_EDGES, *(-x for x in INT_EDGES if x <= 2**63), -32, -33, -128, -129])
def test_an_int_at_each_boundary_is_msgspecs(x: int) -> None:
    assert _written(pw.write_int, x) == _msgpack(x)


@given(st.integers(min_value=-(2**63), max_value=2**64 - 1))
def test_any_int_in_range_is_msgspecs(x: int) -> None:
    assert _written(pw.write_int, x) == _msgpack(x)


@pytest.mark.parametrize("x", [2**64, -(2**63) - 1])
def test_an_int_out_of_range_is_refused_as_msgspec_refuses_it(x: int) -> None:
    with pytest.raises(OverflowError, match="can't serialize ints"):
        _msgpack(x)
    with pytest.raises(OverflowError, match="can't serialize ints"):
        _written(pw.write_int, x)


@given(st.floats(allow_nan=True) | st.sampled_from([0.0, -0.0, math.inf, -math.inf, 5e-324]))
def test_a_float_is_msgspecs(x: float) -> None:
    assert _written(pw.write_float, x) == _msgpack(x)


@pytest.mark.parametrize("n", LENGTHS)
def test_str_bin_and_array_headers_at_each_length_are_msgspecs(n: int) -> None:
    assert _written(pw.write_str, "a" * n) == _msgpack("a" * n)
    assert pw.str_bytes("b" * n) == _msgpack("b" * n)
    assert _written(pw.write_bin, b"x" * n) == _msgpack(b"x" * n)
    w = BytesWriter()
    pw.write_array_head(w, n)
    assert w.getvalue() + b"\xc0" * n == _msgpack([None] * n)


@given(st.text())
def test_any_text_is_msgspecs(s: str) -> None:
    assert _written(pw.write_str, s) == _msgpack(s)
    assert _written(pw.write_opt_str, s) == _msgpack(s)


def test_none_bools_and_type_names() -> None:
    assert _written(pw.write_opt_str, None) == _written(pw.write_opt_int, None) == _msgpack(None)
    assert bytes((pw.TRUE, pw.FALSE)) == _msgpack(True) + _msgpack(False)
    assert pw.type_name_bytes(Add(1)) == _msgpack("Add")


def test_the_last_string_and_type_remembered_are_the_ones_asked_for() -> None:
    for s in ["b/0", "b/1", "b/1", "b/0", "", "b/0"]:
        assert pw.str_bytes(s) == _msgpack(s)
    for obj in [Add(1), Started(cls="x", args={}), Started(cls="y", args={}), Add(2), "s", 1]:
        assert pw.type_name_bytes(obj) == _msgpack(type(obj).__name__)


def test_the_caches_are_bounded() -> None:
    for i in range(pw.CACHE_LIMIT + 10):
        assert pw.str_bytes(f"s{i}") == _msgpack(f"s{i}")
    assert len(pw._STRS) <= pw.CACHE_LIMIT


def _delivered(outputs: list[Out], corr: str | None = None, reply_to: int | None = None) -> tuple[Cell, Envelope]:
    """A Counter cell that has just executed an `Add`, its outputs replaced by `outputs`."""
    cell = Cell("c/0", seed=1)
    started = Started(cls=class_path(Counter), args={}, parent=None)
    execute(cell, Envelope("ext/operator", "c/0", 1, 0, None, started), 0.0)
    env = Envelope("c/1", "c/0", 2**40, 2**50 + 3, corr, Add(5), reply_to, True, False)
    execute(cell, env, 1.5)
    cell.ctx.outputs = outputs
    return cell, env


@pytest.mark.parametrize("snapshot", [False, True])
def test_a_delivery_is_written_as_its_step_and_its_row_encode(snapshot: bool) -> None:
    outputs = [
        Out(0, "c/1", Add(-7), 0.0, 1, "r1"),
        Out(1, "c/0", Add(2), 2.25, 2, "r1", 9, False, "ask:9"),  # a timer, with its key
        Out(2, "c/0", None, 0.0, 3, None, key="t1"),  # a cancel: no message
        Out(0, "c/2", Add(0), 0.0, 4, None, None, True),  # an ask
    ]
    cell, env = _delivered(outputs, corr="r1", reply_to=17)
    assert cell.ctx.events  # the Add recorded an event
    w = BytesWriter()
    snap = make_step(cell, env, 1.5, snapshot).snapshot
    pw.write_delivery(w, cell, env, 1.5, snap)
    expected = _msgpack(make_step(cell, env, 1.5, snapshot))
    assert w.getvalue() == expected == _msgpack(make_row(cell, env, 1.5, snapshot))
    assert (snap is not None) == snapshot
    assert all(o.payload == (None if o.msg is None else _msgpack(o.msg)) for o in outputs)


def test_a_delivery_with_no_outputs_nor_events() -> None:
    cell, env = _delivered([])
    cell.ctx.events = []
    w = BytesWriter()
    pw.write_delivery(w, cell, env, 1.5, None)
    assert w.getvalue() == _msgpack(make_step(cell, env, 1.5, False))


def test_random_networks_page_what_their_steps_encode() -> None:
    """Asks, timers, cancels, spawns, stops and failing handlers (tests/core/netactors)."""
    every: list[Step] = []
    for net_seed in (11, 12, 13):
        net = random_network(random.Random(net_seed), 30)
        steps, pages = MemorySink(), PageSink()
        run_network(net, 5, steps)
        run_network(net, 5, pages)
        starts = list(itertools.accumulate(pages.batches, initial=0))[:-1]
        pages_of_steps = [steps.steps[a:a + n] for a, n in zip(starts, pages.batches, strict=True)]
        assert pages.pages == [_msgpack(page) for page in pages_of_steps]
        every += steps.steps
    outputs = [o for s in every for o in s.outputs]
    assert len(every) > 300 and any(len(s.outputs) > 1 for s in every) and any(s.events for s in every)
    assert {o.kind for o in outputs} >= {0, 1, 2} and any(o.type == "" for o in outputs)
    assert any(o.ask for o in outputs) and any(s.input.reply_to is not None for s in every)
