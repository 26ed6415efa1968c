"""A live `deepserve up` on a free loopback port, shared by the module's tests (one start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from daemonproc import start_daemon, stop_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("daemon") / "run"
    proc, info = start_daemon(run_dir)
    info["proc"] = proc
    info["stop"] = lambda: stop_daemon(proc)
    yield info
    if proc.poll() is None:
        stop_daemon(proc)
