"""The README's embedding example runs exactly as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_example_is_short_and_runs_as_written(tmp_path: Path) -> None:
    (block,) = _python_blocks()
    assert len(block.strip().splitlines()) <= 15
    script = tmp_path / "readme_example.py"
    script.write_text(block)
    res = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "2.0 ['ada', 'alan']\n"


def test_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
