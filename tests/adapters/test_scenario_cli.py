"""The sim command's progress bar: on a terminal only, never with --json or in a pipe."""

from __future__ import annotations

import io
import sys
from typing import Any

from deepserve.adapters.traces.reader import Trace
from deepserve.cli import sim_scenario as cli


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(monkeypatch: Any) -> None:
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert cli._progress(10, quiet=False) is None  # a pipe or a file
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli._progress(10, quiet=True) is None  # --json
    bar = cli._progress(10, quiet=False)
    assert bar is not None
    bar.update(10)
    bar.close()
    assert "10/10" in tty.getvalue()


def test_row_count_for_the_bar_total(tmp_path: Any) -> None:
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nx,1,1\ny,1,1\n\n")
    assert Trace(p).rows() == 2  # the header and the blank line are not rows
    m = tmp_path / "m.jsonl"
    m.write_text("{}\n{}\n{}\n")
    assert Trace(m).rows() == 3
