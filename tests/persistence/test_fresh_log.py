"""A new SQLite log made without SQLAlchemy (`sqlite/fresh.py`) is the log SQLAlchemy makes."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from deepserve.persistence import LogError, open_log, open_sink
from deepserve.persistence.schema import INSERT_COLUMNS, RUN_FIELDS, SCHEMA_VERSION, metadata
from deepserve.persistence.sqlite import fresh
from deepserve.persistence.sqlite.batch_store import insert_sql
from deepserve.persistence.sqlite.files import prepare_sqlite


def _norm(sql: str) -> str:
    """One statement with SQLAlchemy's layout whitespace taken out."""
    return re.sub(r"\s*([(),])\s*", r"\1", re.sub(r"\s+", " ", sql)).strip()


def _compiled_schema() -> list[str]:
    dialect = sqlite_dialect.dialect()
    out = []
    for table in metadata.sorted_tables:
        out.append(str(CreateTable(table).compile(dialect=dialect)))
        out += [str(CreateIndex(ix).compile(dialect=dialect)) for ix in sorted(table.indexes, key=lambda i: i.name or "")]
    return out


def test_the_statements_are_the_schemas_as_sqlalchemy_compiles_them() -> None:
    # A schema change fails here: paste the `expected` statements into fresh.py.
    expected = [_norm(s) for s in _compiled_schema()]
    assert [_norm(s) for s in fresh.CREATE_SCHEMA] == expected, "\n".join(expected)
    assert fresh.SCHEMA_VERSION == SCHEMA_VERSION
    assert _norm(fresh.INSERT_RUN) == _norm(insert_sql()["runs"])
    assert _norm(fresh.INSERT_PAGE) == _norm(insert_sql()["pages"])
    assert _norm(fresh.INSERT_RUN_END) == _norm(insert_sql()["run_ends"])
    assert fresh.RUN_COLUMNS == len(INSERT_COLUMNS["runs"])
    assert (fresh.RUN_ID_INDEX, fresh.PROCESS_INDEX) == (RUN_FIELDS.index("run_id"), RUN_FIELDS.index("process"))


def _shape(path: Path) -> tuple[list[tuple[str, str, str]], int, str, list[int]]:
    conn = sqlite3.connect(path)
    try:
        master = conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version")]
    finally:
        conn.close()
    return [(t, n, _norm(s or "")) for t, n, s in master], page, journal, versions


@pytest.mark.parametrize("page_bytes", [0, 65536])
def test_a_fresh_log_is_the_one_prepare_sqlite_makes(tmp_path: Path, page_bytes: int) -> None:
    ours, theirs = tmp_path / "fresh.db", tmp_path / "sqlalchemy.db"
    assert fresh.create_log(str(ours), page_bytes=page_bytes) is True
    assert prepare_sqlite(str(theirs), create=True, upgrade=True, page_bytes=page_bytes) == (SCHEMA_VERSION, SCHEMA_VERSION)
    assert _shape(ours) == _shape(theirs)
    assert _shape(ours)[1:] == (page_bytes or 4096, "wal", [SCHEMA_VERSION])
    # and SQLAlchemy's side takes it as a current log, with nothing to migrate
    assert prepare_sqlite(str(ours), create=False, upgrade=False) == (SCHEMA_VERSION, SCHEMA_VERSION)


def test_an_empty_file_is_created_an_existing_log_left_alone(tmp_path: Path) -> None:
    empty = tmp_path / "touched.db"
    empty.touch()  # `touch run.db` is a fine start, as for prepare_sqlite
    assert fresh.create_log(str(empty)) is True
    before = empty.read_bytes()
    assert fresh.create_log(str(empty)) is False  # a database already: prepare_sqlite's job
    assert empty.read_bytes() == before


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 10)
    with pytest.raises(LogError, match="junk.db: not an SQLite database"):
        fresh.create_log(str(junk))
    with pytest.raises(LogError, match="no such directory"):
        fresh.create_log(str(tmp_path / "missing" / "x.db"))


def test_a_simulation_writes_its_log_without_importing_sqlalchemy(tmp_path: Path) -> None:
    # What the split `deepserve sim` pays before its workers start (fresh.py's docstring).
    log = tmp_path / "sim.db"
    code = (
        "import sys\n"
        "from deepserve.adapters.scenario.loader import load_scenario\n"
        "from deepserve.cluster.run import run_scenario\n"
        "from deepserve.persistence import open_sink\n"
        f"sink = open_sink({str(log)!r}, 'async', writer='process')\n"
        "r = run_scenario(load_scenario('mooncake-16te', ()), requests=20, sink=sink)\n"
        "sink.close()\n"
        "assert r.summary['completed'] == 20, r.summary\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    with open_log(str(log)) as reader:  # and it reads back
        assert sum(1 for _ in reader.steps()) > 20


def test_open_sink_on_an_existing_log_still_checks_it(tmp_path: Path) -> None:
    log = tmp_path / "old.db"
    conn = sqlite3.connect(log)
    conn.execute("CREATE TABLE unrelated (x INTEGER)")
    conn.close()
    with pytest.raises(LogError, match="not a deepserve log"):
        open_sink(str(log), "async", writer="process")
