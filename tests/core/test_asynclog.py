"""AsyncDriver's paged log (core/asynclog.py): deliveries written into a page as they are made
and handed to the sink a page at a time leave the same log as the readable version, a `Step` per
delivery through `append` (`make_step`); an open page reaches the writer without a flush."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec
from kernel_actors import Counter
from test_asyncdriver import SCRIPT

from deepserve.core import MemorySink
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.records import Step
from deepserve.persistence import open_log, open_sink


async def _run(sink: object) -> AsyncDriver:
    async with AsyncDriver(seed=3, sink=sink) as d:  # type: ignore[arg-type]
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        await d.idle()
        for dst, msg in SCRIPT:
            await d.inject(dst, msg)
            await d.idle()
    return d


def _timeless(step: Step) -> object:
    """A step without what the wall clock sets (times; HLCs, which follow the clock), and
    without a failed handler's traceback text."""
    inp = msgspec.structs.replace(step.input, t=0.0, hlc=0, src_hlc=0)
    events = tuple(msgspec.structs.replace(e, payload=b"") if e.type == "HandlerFailed" else e
                   for e in step.events)  # fmt: skip
    return (inp, events, step.outputs, step.snapshot)


async def test_paged_log_has_the_steps_of_one_append_a_step(tmp_path: Path) -> None:
    ref = MemorySink()  # the readable version: a Step per delivery (`make_step` + `append`)
    d_ref = await _run(ref)
    path = str(tmp_path / "log.db")
    sink = open_sink(path, "async")
    assert hasattr(sink, "append_page")  # the SQLite paged layout takes pages
    d = await _run(sink)
    sink.close()
    assert d.pages_handed > 0 and d_ref.pages_handed == 0
    with open_log(path) as log:
        paged = list(log.steps())
    assert len(paged) == len(ref.steps) > len(SCRIPT)
    assert [_timeless(s) for s in paged] == [_timeless(s) for s in ref.steps]


async def test_an_open_page_reaches_the_writer_without_a_flush(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "log.db"), "async", linger_s=0.02)
    try:
        async with AsyncDriver(seed=1, sink=sink) as d:
            d.spawn("c/0", Counter)
            await d.idle()
            end = time.monotonic() + 30
            # the spawn's step sits in the open page until the hand-over callback (page_hold_s)
            while sink.statistics().committed < 1 and time.monotonic() < end:
                await anyio.sleep(0.01)
            assert sink.statistics().committed >= 1
            assert d.pages_handed >= 1
    finally:
        sink.close()
