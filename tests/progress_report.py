"""A line on the terminal whenever the suite has been silent for a while (issue 29 §7).

pytest prints a dot per finished test; a test that runs a minute (a live daemon on a loaded
machine) leaves the terminal silent for that minute, and a newcomer cannot tell a slow suite
from a hung one. After `DEEPSERVE_TEST_PROGRESS_S` seconds (default 25) without a result, this
plugin prints how many tests are done and which are running, for how long. It runs in xdist's
controller (`make test` runs the suite with -n auto), where results arrive and nothing is
captured; a run without xdist captures the terminal while a test runs, so there it stays quiet.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

DEFAULT_SILENCE_S = 25.0


class ProgressReport:
    def __init__(self, config: pytest.Config, silence_s: float) -> None:
        self.config = config
        self.silence_s = silence_s
        self.started = time.monotonic()
        self.last_output = self.started
        self.done = 0
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="progress-report", daemon=True)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if session.config.pluginmanager.has_plugin("dsession"):  # xdist's controller
            self.thread.start()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        with self.lock:
            self.running.pop(nodeid, None)
            self.done += 1
            self.last_output = time.monotonic()

    def _watch(self) -> None:
        while not self.stop.wait(min(1.0, self.silence_s / 4)):
            now = time.monotonic()
            with self.lock:
                if now - self.last_output < self.silence_s:
                    continue
                self.last_output = now
                line = self._line(now)
            writer = self.config.get_terminal_writer()
            writer.line()
            writer.line(line)
            writer.flush()

    def _line(self, now: float) -> str:
        oldest = sorted(self.running.items(), key=lambda kv: kv[1])[:3]
        running = ", ".join(f"{nodeid} ({now - t0:.0f} s)" for nodeid, t0 in oldest)
        more = f" and {len(self.running) - 3} more" if len(self.running) > 3 else ""
        elapsed = now - self.started
        return (f"[still running after {elapsed // 60:.0f}m{elapsed % 60:02.0f}s: {self.done} tests done; "
                f"running {running or 'nothing (collecting or between tests)'}{more}]")


def register(config: pytest.Config) -> None:
    """Register the report in a session's reporting process (not in an xdist worker)."""
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    silence_s = float(os.environ.get("DEEPSERVE_TEST_PROGRESS_S", DEFAULT_SILENCE_S))
    config.pluginmanager.register(ProgressReport(config, silence_s), "deepserve-progress-report")


def pytest_configure(config: pytest.Config) -> None:
    """Loaded as a plugin (`-p progress_report`) rather than through tests/conftest.py."""
    register(config)
