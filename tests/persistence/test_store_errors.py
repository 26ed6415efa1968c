"""Unreadable logs give one precise line naming the file; old logs migrate explicitly."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from store_testdata import edge_steps, encoded, run_rec

from deepserve.persistence import SCHEMA_VERSION, LogError, migrate, open_log, open_sink


def _one_line_error(target: str, fn: Any = open_log) -> str:
    with pytest.raises(LogError) as info:
        log = fn(target)
        list(log.steps())  # some damage only shows when pages are read
    msg = str(info.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def _write_log(path: Path, steps: int = 1) -> None:
    sink = open_sink(str(path))
    sink.begin_run(run_rec("r"))
    for _ in range(steps):
        for s in edge_steps():
            sink.append(s)
    sink.close()


def test_missing_path(tmp_path: Path) -> None:
    p = str(tmp_path / "nope.db")
    assert _one_line_error(p) == f"{p}: no such file or directory"


def test_garbage_bytes(tmp_path: Path) -> None:
    p = tmp_path / "garbage.db"
    p.write_bytes(os.urandom(8192))
    assert (
        _one_line_error(str(p))
        == f"{p}: not an SQLite database (bad file header), not a deepserve log"
    )


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "notes.db"
    p.write_text("hello\n" * 100)
    assert "not an SQLite database" in _one_line_error(str(p))


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "empty.db"
    p.touch()
    assert _one_line_error(str(p)) == f"{p}: empty file (0 bytes), not a deepserve log"


@pytest.mark.parametrize("keep", [50, 4096 * 3, 0.5, 0.9])
def test_truncated_file(tmp_path: Path, keep: float) -> None:
    p = tmp_path / "cut.db"
    _write_log(p, steps=2)
    size = p.stat().st_size
    n = int(keep) if keep >= 1 else int(size * keep)
    with open(p, "r+b") as f:
        f.truncate(n)
    msg = _one_line_error(str(p))
    assert msg.startswith(f"{p}: truncated: {n} bytes"), msg


def test_corrupt_pages(tmp_path: Path) -> None:
    p = tmp_path / "bitrot.db"
    _write_log(p, steps=2)
    size = p.stat().st_size
    with open(p, "r+b") as f:  # same size, but the b-tree pages after the first are noise
        f.seek(4096)
        f.write(b"\x0d\xff" * ((size - 4096) // 2))
    msg = _one_line_error(str(p))
    assert msg.startswith(f"{p}: ") and ("corrupt" in msg or "malformed" in msg), msg


def test_sqlite_database_that_is_not_a_log(tmp_path: Path) -> None:
    p = tmp_path / "other.db"
    sqlite3.connect(p).execute("CREATE TABLE things (x)").connection.commit()
    assert _one_line_error(str(p)) == f"{p}: not a deepserve log (no schema_version table)"
    q = tmp_path / "blank.db"
    c = sqlite3.connect(q)
    c.execute("PRAGMA user_version=1")  # a valid database file with no tables
    c.close()
    assert _one_line_error(str(q)) == f"{q}: not a deepserve log (the database has no tables)"
    # a sink refuses to scribble into someone else's database
    assert "no schema_version table" in _one_line_error(str(p), fn=open_sink)


def test_newer_schema_version(tmp_path: Path) -> None:
    p = tmp_path / "future.db"
    _write_log(p)
    c = sqlite3.connect(p)
    c.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    c.commit()
    c.close()
    msg = _one_line_error(str(p))
    assert msg == (
        f"{p}: log schema version {SCHEMA_VERSION + 1} is newer than this deepserve supports "
        f"({SCHEMA_VERSION}); upgrade deepserve to read it"
    )
    assert "is newer" in _one_line_error(str(p), fn=open_sink)


def test_directory_problems(tmp_path: Path) -> None:
    assert _one_line_error(str(tmp_path)) == f"{tmp_path}: no *.db log files in this directory"
    _write_log(tmp_path / "a.db")
    (tmp_path / "b.db").write_bytes(b"junk" * 100)
    assert _one_line_error(str(tmp_path)).startswith(f"{tmp_path / 'b.db'}: not an SQLite database")


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("mysql://u@h/db", "unsupported log URL scheme 'mysql'"),
        ("sqlite://", "an SQLite log needs a file path"),
        ("", "empty log target"),
    ],
)
def test_bad_targets(target: str, fragment: str) -> None:
    assert fragment in _one_line_error(target)


def test_sink_in_missing_directory(tmp_path: Path) -> None:
    p = str(tmp_path / "no" / "such" / "run.db")
    assert "no such directory" in _one_line_error(p, fn=open_sink)


def test_postgres_unreachable() -> None:
    msg = _one_line_error("postgresql://postgres@127.0.0.1:1/nothing")
    assert msg.startswith("postgresql+asyncpg://postgres@127.0.0.1:1/nothing: cannot connect"), msg


def test_postgres_database_that_is_not_a_log(postgres_server: Any) -> None:
    url = postgres_server.new_database()
    postgres_server.execute("CREATE TABLE things (x int)", database=url.rsplit("/", 1)[1])
    assert _one_line_error(url) == f"{url}: not a deepserve log (no schema_version table)"
    assert "no schema_version table" in _one_line_error(url, fn=open_sink)


# ---- migration ---------------------------------------------------------------

# The v1 schema as shipped, frozen here by hand: no runs.process column.
V1_DDL = """
CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, applied_at DOUBLE NOT NULL);
CREATE TABLE runs (id INTEGER NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, mode TEXT NOT NULL,
  seed BIGINT NOT NULL, config TEXT NOT NULL, code_version TEXT NOT NULL, host TEXT NOT NULL,
  started_at DOUBLE NOT NULL);
CREATE TABLE inputs (id INTEGER NOT NULL PRIMARY KEY, run_id TEXT NOT NULL, actor TEXT NOT NULL,
  seq BIGINT NOT NULL, t DOUBLE NOT NULL, hlc BIGINT NOT NULL, kind INTEGER NOT NULL,
  src TEXT NOT NULL, msg_id BIGINT NOT NULL, corr TEXT, reply_to BIGINT, external BOOLEAN NOT NULL,
  type TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX ix_inputs_actor ON inputs (run_id, actor, seq);
CREATE INDEX ix_inputs_corr ON inputs (run_id, corr);
CREATE INDEX ix_inputs_t ON inputs (run_id, t);
CREATE TABLE events (id INTEGER NOT NULL PRIMARY KEY, step_id BIGINT NOT NULL,
  run_id TEXT NOT NULL, actor TEXT NOT NULL, seq BIGINT NOT NULL, idx INTEGER NOT NULL,
  type TEXT NOT NULL, payload BLOB NOT NULL);
CREATE INDEX ix_events_step ON events (step_id);
CREATE TABLE outputs (id INTEGER NOT NULL PRIMARY KEY, step_id BIGINT NOT NULL,
  run_id TEXT NOT NULL, actor TEXT NOT NULL, seq BIGINT NOT NULL, idx INTEGER NOT NULL,
  kind INTEGER NOT NULL, dst TEXT NOT NULL, msg_id BIGINT NOT NULL, delay DOUBLE NOT NULL,
  "key" TEXT, corr TEXT, reply_to BIGINT, ask BOOLEAN NOT NULL, type TEXT NOT NULL,
  payload BLOB NOT NULL);
CREATE INDEX ix_outputs_step ON outputs (step_id);
CREATE TABLE snapshots (id INTEGER NOT NULL PRIMARY KEY, step_id BIGINT NOT NULL,
  run_id TEXT NOT NULL, actor TEXT NOT NULL, seq BIGINT NOT NULL, type TEXT NOT NULL,
  payload BLOB NOT NULL);
CREATE INDEX ix_snapshots_step ON snapshots (step_id);
INSERT INTO schema_version VALUES (1, 0);
INSERT INTO runs VALUES (1, 'old-run', 'sim', 42, '{}', '0.0.9', 'old-host', 100.0);
INSERT INTO inputs VALUES (1, 'old-run', 'a/1', 1, 0.5, 7, 0, 'ext/op', 1, 'c1', NULL, TRUE,
  'Ping', x'01');
INSERT INTO events VALUES (1, 1, 'old-run', 'a/1', 1, 0, 'Pinged', x'02');
INSERT INTO outputs VALUES (1, 1, 'old-run', 'a/1', 1, 0, 0, 'b/1', 1, 0.0, NULL, 'c1', NULL,
  FALSE, 'Pong', x'03');
"""


def _v1_log(path: Path) -> str:
    c = sqlite3.connect(path)
    c.execute("PRAGMA journal_mode=WAL")
    c.executescript(V1_DDL)
    c.close()
    return str(path)


def _versions(path: str) -> list[int]:
    return [
        r[0] for r in sqlite3.connect(path).execute("SELECT version FROM schema_version ORDER BY 1")
    ]


def test_v1_log_opens_after_migration(tmp_path: Path) -> None:
    p = _v1_log(tmp_path / "v1.db")
    log = open_log(p)
    [run] = log.runs()
    assert (run.run_id, run.process, run.seed) == ("old-run", "main", 42)
    [step] = list(log.steps())
    assert (step.input.actor, step.input.corr, step.input.external, step.input.payload) == (
        "a/1",
        "c1",
        True,
        b"\x01",
    )
    assert [e.payload for e in step.events] == [b"\x02"] and step.outputs[0].ask is False
    log.close()
    assert _versions(p) == list(range(1, SCHEMA_VERSION + 1))


def test_v1_log_refused_without_upgrade_then_migrated(tmp_path: Path) -> None:
    p = _v1_log(tmp_path / "v1.db")
    msg = _one_line_error(p, fn=lambda t: open_log(t, upgrade=False))
    want = (
        f"log schema version 1 is older than {SCHEMA_VERSION}; migrate it first "
        "(deepserve replay migrate LOG)"
    )
    assert msg == f"{p}: {want}"
    assert _versions(p) == [1]  # untouched
    assert migrate(p) == {p: (1, SCHEMA_VERSION)}
    assert migrate(p) == {p: (SCHEMA_VERSION, SCHEMA_VERSION)}  # idempotent
    assert open_log(p, upgrade=False).runs()[0].process == "main"


def test_v1_log_appended_by_a_new_sink(tmp_path: Path) -> None:
    p = _v1_log(tmp_path / "v1.db")
    sink = open_sink(p)
    sink.begin_run(run_rec("new-run", process="te-2"))
    for s in edge_steps():
        sink.append(s)
    sink.close()
    log = open_log(p)
    assert [(r.run_id, r.process) for r in log.runs()] == [("old-run", "main"), ("new-run", "te-2")]
    assert encoded(list(log.steps())) == encoded(edge_steps())
    assert len(list(log.steps("old-run"))) == 1


def test_migrate_a_directory(tmp_path: Path) -> None:
    a = _v1_log(tmp_path / "a.db")
    b = tmp_path / "b.db"
    _write_log(b)
    assert migrate(str(tmp_path)) == {a: (1, SCHEMA_VERSION), str(b): (SCHEMA_VERSION, SCHEMA_VERSION)}


def test_migrate_postgres(postgres_server: Any) -> None:
    url = postgres_server.new_database()
    db = url.rsplit("/", 1)[1]
    # the same v1 schema in PostgreSQL's spelling
    ddl = V1_DDL.replace("id INTEGER NOT NULL PRIMARY KEY", "id BIGSERIAL PRIMARY KEY")
    ddl = ddl.replace("DOUBLE", "DOUBLE PRECISION").replace("BLOB", "BYTEA")
    ddl = ddl.replace("x'0", "'\\x0")
    postgres_server.execute(ddl, database=db)
    with pytest.raises(LogError, match=f"older than {SCHEMA_VERSION}"):
        open_log(url, upgrade=False)
    assert migrate(url) == {url: (1, SCHEMA_VERSION)}
    log = open_log(url)
    assert log.runs()[0].process == "main"
    [step] = list(log.steps())
    assert step.input.payload == b"\x01" and step.outputs[0].payload == b"\x03"
    log.close()


def test_copy_of_log_keeps_working(tmp_path: Path) -> None:
    """A closed log is one self-contained file (the WAL is checkpointed on close)."""
    p = tmp_path / "a.db"
    _write_log(p)
    assert not (tmp_path / "a.db-wal").exists()
    shutil.copy(p, tmp_path / "copy.db")
    assert encoded(list(open_log(str(tmp_path / "copy.db")).steps())) == encoded(edge_steps())
