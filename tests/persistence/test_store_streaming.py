"""Readers stream: a log much larger than the reader's memory use is read in chunks."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from store_testdata import force_reader_process, run_rec

from deepserve.core.records import EventRec, InputRec, OutputRec, Step
from deepserve.persistence import open_log, open_sink
from deepserve.persistence.sqlite import log_reader as sqlite_reader

PAYLOAD = bytes(range(256)) * 8  # 2 KiB per record


def _big_log(target: str, n: int) -> None:
    with open_sink(target, layout="rows") as sink:
        sink.begin_run(run_rec("big"))
        for i in range(n):
            sink.append(
                Step(
                    InputRec(
                        f"a/{i % 5}",
                        i,
                        i * 0.001,
                        i,
                        0,
                        "x/1",
                        i,
                        f"c{i % 50}",
                        None,
                        False,
                        "M",
                        PAYLOAD,
                    ),
                    [EventRec(f"a/{i % 5}", i, 0, "E", PAYLOAD)],
                    [
                        OutputRec(
                            f"a/{i % 5}",
                            i,
                            0,
                            0,
                            "b/1",
                            i,
                            0.0,
                            None,
                            None,
                            None,
                            False,
                            "M",
                            PAYLOAD,
                        )
                    ],
                )
            )


def _peak_while(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["sqlite", "sqlite-readproc", "postgresql"])
def test_reading_a_large_log_keeps_memory_bounded(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 12_000  # 3 records x 2 KiB each: ~72 MiB of payload
    if kind == "sqlite-readproc":  # all but the first 1000 steps through the reader process
        force_reader_process(monkeypatch, lead=1000)
    elif kind == "sqlite":  # all in-process
        monkeypatch.setattr(sqlite_reader, "MAX_READERS", 0)
    target = (
        str(tmp_path / "big.db")
        if kind.startswith("sqlite")
        else request.getfixturevalue("postgres_url")
    )
    _big_log(target, n)
    log = open_log(target)

    def read_all() -> int:
        count = 0
        for step in log.steps():
            assert step.input.seq == count and step.outputs[0].payload == PAYLOAD
            count += 1
        return count

    count, peak = _peak_while(read_all)
    assert count == n
    assert peak < 24 * 2**20, f"peak {peak / 2**20:.1f} MiB while streaming ~72 MiB"
    filtered, peak = _peak_while(lambda: sum(1 for _ in log.steps(since=3.0, until=9.0)))
    assert filtered == 6001 and peak < 24 * 2**20
    log.close()
