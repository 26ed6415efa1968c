"""Running the `deepserve` command in tests, and the one-line error contract.

`deepserve(...)` starts `python -m deepserve` in a subprocess: for what the process boundary
is part of (the exit status as the shell sees it, PYTHONHASHSEED, atexit, fresh imports).
`in_process(...)` calls the CLI's `main()` in this process with stdout and stderr captured:
the same answer without a Python start and deepserve's imports (~0.5 s each, several seconds
on a loaded machine), for what only checks the arguments, the messages and the exit status.
Keep the subprocess for user modules loaded by `--path`/`--import` (they stay imported here, a
later test would see the first one's), split runs (`--workers` forks the process it runs in),
and anything about PYTHONHASHSEED, atexit or a fresh interpreter.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def deepserve(*args: str, cwd: Path, hashseed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONHASHSEED": hashseed,
        "PYTHONPATH": os.pathsep.join([str(TESTS / "core"), str(TESTS / "replay")]),
    }
    env.pop("DEEPSERVE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "deepserve", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`deepserve ARGS` run by `main()` here, in `cwd`; what the process shares is put back after
    (working directory, import path, GC thresholds, DEEPSERVE_DEBUG). An exception that escapes
    `main()` is not caught: the CLI's promise is that none does, so it fails the test."""
    from deepserve.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = (os.getcwd(), list(sys.path), gc.get_threshold(), os.environ.pop("DEEPSERVE_DEBUG", None))
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:  # argparse: --help, --version, a bad argument
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(saved[0])
        sys.path[:] = saved[1]
        gc.set_threshold(*saved[2])
        if saved[3] is not None:
            os.environ["DEEPSERVE_DEBUG"] = saved[3]
    return subprocess.CompletedProcess(["deepserve", *args], code, out.getvalue(), err.getvalue())


def assert_one_line_error(res: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, exactly one line on stderr, no traceback; returns that line."""
    assert res.returncode == 2, (res.returncode, res.stdout[:500], res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
