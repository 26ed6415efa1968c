"""Shared fixtures.

`postgres_server`: a throwaway PostgreSQL (initdb + pg_ctl) on 127.0.0.1 at a free port
for the whole session, trust auth, fsync off. Skipped only when the binaries are not
on PATH. `postgres_url`: a fresh, empty database on it for one test (asyncpg URL).

The suite prints a progress line whenever it has been silent for 25 s (progress_report.py).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest

# Test helper modules (actor classes that replay loads by "module:QualName", the CLI
# runner) live beside the tests that use them; make them importable from any test.
_TESTS = os.path.dirname(os.path.abspath(__file__))
for _sub in ("core", "replay", "cli", "adapters"):
    _path = os.path.join(_TESTS, _sub)
    if _path not in sys.path:
        sys.path.append(_path)

if _TESTS not in sys.path:
    sys.path.append(_TESTS)
import progress_report  # noqa: E402  (beside this file: importable once the line above ran)


def pytest_configure(config: pytest.Config) -> None:
    progress_report.register(config)


PG_BINARIES = ("initdb", "pg_ctl", "postgres")


class PgServer:
    def __init__(self, root: str, port: int, as_user: list[str]) -> None:
        self.root = root
        self.data = os.path.join(root, "data")
        self.port = port
        self.as_user = as_user
        self._names = itertools.count(1)

    def url(self, database: str) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh empty database; returns its URL."""
        name = f"t{next(self._names)}"
        self.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def execute(self, sql: str, database: str = "postgres") -> None:
        import asyncpg

        async def go() -> None:
            conn = await asyncpg.connect(
                host="127.0.0.1", port=self.port, user="postgres", database=database
            )
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        # Own thread, own loop: a test may already be running inside an event loop.
        errors: list[BaseException] = []
        t = threading.Thread(target=lambda: _capture(errors, lambda: asyncio.run(go())))
        t.start()
        t.join()
        if errors:
            raise errors[0]


def _capture(errors: list[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 — re-raised in the caller's thread
        errors.append(exc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str], what: str, log: str | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        tail = ""
        if log and os.path.exists(log):
            with open(log) as f:
                tail = f.read()[-2000:]
        raise RuntimeError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()} {tail}")


def _start(server: PgServer) -> None:
    initdb = "initdb -A trust -U postgres --no-sync -E UTF8 --locale=C -D".split()
    _run([*server.as_user, *initdb, server.data], "initdb")
    opts = (
        f"-c listen_addresses=127.0.0.1 -p {server.port} -c unix_socket_directories={server.root} "
        "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    )
    log = os.path.join(server.root, "server.log")
    start = ["pg_ctl", "-D", server.data, "-o", opts, "-l", log, "-w", "-t", "60", "start"]
    _run([*server.as_user, *start], "pg_ctl start", log)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PgServer]:
    missing = [b for b in PG_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(f"PostgreSQL server binaries not on PATH: {', '.join(missing)}")
    root = tempfile.mkdtemp(prefix="deepserve-pg-")
    as_user: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root: run it as the postgres user
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    server = PgServer(root, _free_port(), as_user)
    try:
        _start(server)
        yield server
    finally:
        if os.path.exists(os.path.join(server.data, "postmaster.pid")):
            stop = ["pg_ctl", "-D", server.data, "stop", "-m", "immediate"]
            subprocess.run([*as_user, *stop], capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PgServer) -> str:
    return postgres_server.new_database()
