"""`deepserve up` refuses an address it cannot listen on, a run directory it cannot make, or settings
that cannot work together, before it writes anything: exit 2, one line naming the flag, no log
left behind (a user tour: a port in
use exited 3 with uvicorn's `ERROR: [Errno 98]` and a half-written daemon.db, so the same
`--run-dir` was then refused as "already holds a daemon log"; a run dir under a regular file
was `internal error: NotADirectoryError`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


def up(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deepserve", "up", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess[str], flag: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("deepserve: error: "), r.stderr
    assert flag in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.fixture
def taken() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_a_port_in_use_is_refused_before_the_log_is_written(tmp_path: Path, taken: int) -> None:
    run_dir = tmp_path / "run"
    for _ in range(2):  # the same run dir again: still the port's error, no leftover log in the way
        r = up("--port", str(taken), "--run-dir", str(run_dir), cwd=tmp_path)
        one_error_line(r, f"--port {taken}")
        assert "address already in use" in r.stderr
        assert not run_dir.exists()
    r = up("--port", str(taken - 1), "--run-dir", str(run_dir), cwd=tmp_path)  # the admin port is taken
    one_error_line(r, f"--port {taken - 1}")
    assert "daemon.admin_port" in r.stderr and not run_dir.exists()


def test_a_host_it_cannot_listen_on_names_host(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for host in ("999.1.1.1", "192.0.2.1"):  # not an address; an address of no local interface
        r = up("--host", host, "--port", "0", "--run-dir", str(run_dir), cwd=tmp_path)
        one_error_line(r, f"--host {host}")
        assert not run_dir.exists()


def test_a_run_dir_that_cannot_be_made_names_run_dir(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    r = up("--port", "0", "--run-dir", str(f / "run"), cwd=tmp_path)
    one_error_line(r, f"--run-dir {f / 'run'}")
    assert "not a directory" in r.stderr
    r = up("--port", "0", "--run-dir", str(f), cwd=tmp_path)
    one_error_line(r, f"--run-dir {f}")
    assert f.read_text() == ""
    # a path the checks pass but the kernel refuses (even root cannot make a directory in /proc)
    r = up("--port", "0", "--run-dir", "/proc/deepserve-nope/run", cwd=tmp_path)
    one_error_line(r, "--run-dir /proc/deepserve-nope/run: cannot be made")


def test_the_admin_port_equal_to_the_port_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Both sockets bound (SO_REUSEADDR), the second listen failed inside the server's task group
    (`internal error: ExceptionGroup`), after the log was written: the next start with the same
    run dir was refused as "already holds a daemon log"."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free now (both sockets would have bound it)
    run_dir = tmp_path / "run"
    for _ in range(2):
        r = up("--port", str(port), "--set", f"daemon.admin_port={port}", "--run-dir", str(run_dir), cwd=tmp_path)
        one_error_line(r, "daemon.admin_port")
        assert "daemon.port" in r.stderr and not run_dir.exists()
    r = up("--port", "65535", "--run-dir", str(run_dir), cwd=tmp_path)  # its admin port, + 1, does not exist
    one_error_line(r, "--port 65535")
    assert "daemon.admin_port" in r.stderr and not run_dir.exists()


def test_a_seed_beyond_64_bits_is_refused_up_front(tmp_path: Path) -> None:
    """It failed inside the log writer (OverflowError), after the run dir and its log were made."""
    run_dir = tmp_path / "run"
    for seed in (2**63, -(2**63) - 1, 2**80):
        r = up("--port", "0", "--set", f"daemon.seed={seed}", "--run-dir", str(run_dir), cwd=tmp_path)
        one_error_line(r, "daemon.seed")
        assert not run_dir.exists()


def test_a_port_some_socket_shares_is_refused_at_bind() -> None:
    """`bind` listens at once: a socket bound to the port by SO_REUSEADDR but not listening no
    longer lets a second bind through (the second listen failed later, after the log was written)."""
    from deepserve.daemon.server import ListenError, bind

    first = bind("127.0.0.1", 0)
    try:
        with pytest.raises(ListenError, match="address already in use") as err:
            bind("127.0.0.1", first.getsockname()[1], admin=True)
        assert err.value.key == "admin_port"
    finally:
        first.close()
