"""A driver whose run fails (a kernel failure re-raised in its task group: here a transport that
raises on send) still hands its open log page to the sink before the failure propagates: the
steps up to the failure are the incident's record. Before, `__aexit__` stopped at the group's
exception and the page (up to the sink's hold window of steps) never reached the log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kernel_actors import Add, Counter, Forward

from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.envelope import Envelope
from deepserve.persistence import open_log, open_sink

pytestmark = pytest.mark.timeout(60)


class BrokenTransport:
    """Owns `peer/...` and raises on every send: a bug in a transport, which no handler records."""

    def __init__(self, close_raises: bool = False) -> None:
        self.closed = False
        self.close_raises = close_raises

    def owns(self, addr: str) -> bool:
        return addr.startswith("peer/")

    def send(self, env: Envelope) -> bool:
        raise RuntimeError("transport bug")

    def attach(self, deliver: Any) -> None:
        self.deliver = deliver

    def close(self) -> None:
        self.closed = True
        if self.close_raises:
            raise OSError("closing failed too")


async def _fail_a_run(path: str, transport: BrokenTransport) -> pytest.ExceptionInfo[BaseException]:
    # A page held far longer than the run takes: only the driver's close hands it over.
    sink = open_sink(path, "async", flush_s=5.0, linger_s=1.0)  # pages held 2.5 s
    try:
        with pytest.raises(BaseException) as failed:  # noqa: B017 — the group's exception, checked below
            async with AsyncDriver(seed=1, sink=sink, transport=transport) as d:  # type: ignore[arg-type]
                d.spawn("c/0", Counter)
                await d.inject("c/0", Add(5))
                await d.idle()
                await d.inject("c/0", Forward("peer/0", 1))  # its step is logged, then routing raises
                await d.idle()
    finally:
        sink.close()
    return failed


def _inputs(path: str) -> list[str]:
    with open_log(path) as log:
        return [step.input.type for step in log.steps(None, actor="c/0")]


async def test_a_failed_run_still_logs_its_steps_up_to_the_failure(tmp_path: Path) -> None:
    path, transport = str(tmp_path / "log.db"), BrokenTransport()
    failed = await _fail_a_run(path, transport)
    assert "transport bug" in repr(failed.value)
    # the spawn, the Add and the Forward whose routing failed: the run up to the failure
    assert _inputs(path)[:3] == ["Started", "Add", "Forward"]
    assert transport.closed


async def test_a_second_failure_while_closing_is_noted_on_the_first(tmp_path: Path) -> None:
    path, transport = str(tmp_path / "log.db"), BrokenTransport(close_raises=True)
    failed = await _fail_a_run(path, transport)
    assert "transport bug" in repr(failed.value)  # the run's own failure is the one raised
    assert any("closing failed too" in note for note in getattr(failed.value, "__notes__", []))
