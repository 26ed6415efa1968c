"""The thread writer's `append_page` (persistence/paged_sink.py): steps a driver encoded itself,
handed over a page at a time and mixed with `append`'s Steps, are stored as the same steps
(in order, checksummed, counted by the run's closing record) as `append`'s one at a time."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from store_testdata import expected

from deepserve.core.records import RunRec
from deepserve.persistence import LogError, open_log, open_sink
from deepserve.persistence.group_commit import GroupCommitSink
from deepserve.persistence.paged_sink import PagedGroupCommitSink
from deepserve.persistence.pages import array_header, page_body

RUN = RunRec(run_id="r", mode="sim", seed=1, config="{}", code_version="t", host="h", started_at=0.0)
ENC = msgspec.msgpack.Encoder().encode


def sim_steps() -> list:
    return expected(requests=24)[1]


def _stored(path: str) -> list:
    with open_log(path) as log:
        log.check_integrity()  # page checksums and the closing record's step count
        assert log.run_end().closed is True
        return list(log.steps())


def test_pages_and_steps_store_what_steps_one_by_one_store(tmp_path: Path) -> None:
    steps = sim_steps()
    assert len(steps) >= 6
    ref_path, paged_path = str(tmp_path / "ref.db"), str(tmp_path / "paged.db")
    ref = open_sink(ref_path, "async")
    ref.begin_run(RUN)
    for s in steps:
        ref.append(s)
    ref.close()
    sink = open_sink(paged_path, "async", max_batch=4)
    assert isinstance(sink, PagedGroupCommitSink)
    sink.begin_run(RUN)
    i, tickets = 0, []
    while i < len(steps):  # a page of up to 3 steps, then a Step alone
        page = steps[i : i + 3]
        body = b"".join(ENC(s) for s in page)
        tickets.append(sink.append_page(body, len(page), min(s.input.t for s in page), max(s.input.t for s in page)))
        i += len(page)
        if i < len(steps):
            tickets.append(sink.append(steps[i]))
            i += 1
    assert tickets[-1] == len(steps)  # a page's ticket is its last step's
    sink.close()
    assert _stored(paged_path) == _stored(ref_path) == steps


def test_page_body_is_msgspecs_list_of_the_steps() -> None:
    steps = sim_steps()[:20]
    from deepserve.persistence.pages import EncodedSteps

    part = [steps[0], EncodedSteps(b"".join(ENC(s) for s in steps[1:19]), 18, 0.0, 1e9), steps[19]]
    raw, head = page_body(part, ENC)
    assert raw == ENC(steps) and raw.startswith(array_header(20))
    assert head.steps == 20


def test_append_page_before_a_run_or_of_too_many_steps_is_refused(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "x.db"), "async", max_batch=4)
    try:
        with pytest.raises(LogError, match="before begin_run"):
            sink.append_page(b"\x90", 1, 0.0, 0.0)
        sink.begin_run(RUN)
        with pytest.raises(ValueError, match="a page holds 1..4"):
            sink.append_page(b"", 5, 0.0, 0.0)
    finally:
        sink.close()


def test_the_row_layout_takes_no_pages(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "rows.db"), "async", layout="rows")
    try:
        assert type(sink) is GroupCommitSink and not hasattr(sink, "append_page")
    finally:
        sink.close()
