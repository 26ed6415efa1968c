"""Replay hands a handler the envelope it saw (ask flag, sender clock), and old
logs are upgraded by `deepserve replay migrate`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cliproc import deepserve
from envactors import EnvReader, Peek

from deepserve.core import SimDriver
from deepserve.persistence import SCHEMA_VERSION, open_log, open_sink
from deepserve.replay.verifier import verify


def test_handlers_reading_ask_and_sender_clock_replay_identically(tmp_path: Path) -> None:
    path = str(tmp_path / "env.db")
    with open_sink(path) as sink:
        d = SimDriver(seed=5, sink=sink)
        d.spawn("env/0", EnvReader)
        d.spawn("env/1", EnvReader)
        d.inject("env/0", Peek(3), at=1.0)
        d.inject("env/1", Peek(0), at=2.0, ask=True)  # an external ask
        d.run()
    seen = d.actor("env/1").state.seen
    assert [a for a, _ in seen] == [True, True, True, True] and all(h > 0 for _, h in seen)
    result = verify(open_log(path))
    assert result.identical and result.inputs == 2 + 1 + 4 + 3  # starts, ext tell, asks, replies


def test_replay_migrate_upgrades_an_old_log(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with open_sink(str(path)) as sink:
        d = SimDriver(seed=1, sink=sink)
        d.spawn("env/0", EnvReader)
        d.run()
    con = sqlite3.connect(path)  # make it a v2 log: drop what v3, v4 and v5 added
    for table in ("runs", "inputs", "events", "outputs", "snapshots"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN crc32")
    con.execute("ALTER TABLE inputs DROP COLUMN ask")
    con.execute("ALTER TABLE inputs DROP COLUMN src_hlc")
    con.execute("DROP TABLE pages")
    con.execute("DROP TABLE run_ends")  # v7
    con.execute("UPDATE schema_version SET version = 2")
    con.commit()
    con.close()
    refused = deepserve("replay", "verify", str(path), cwd=tmp_path)  # reading never migrates
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"deepserve: error: {path}: log schema version 2 is older than {SCHEMA_VERSION}; "
        "migrate it first (deepserve replay migrate LOG)"
    )
    res = deepserve("replay", "migrate", str(path), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{path}: schema 2 -> {SCHEMA_VERSION}"
    again = deepserve("replay", "migrate", str(path), cwd=tmp_path)
    assert again.stdout.strip() == f"{path}: already schema {SCHEMA_VERSION}"
    result = verify(open_log(str(path)))
    # written before closing records (v7): its end is not known, which is not a process that died
    assert result.identical and result.closed is None
    res = deepserve("replay", "verify", str(path), cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("identical: "), res.stdout + res.stderr
    assert res.stderr.strip().endswith("was written before closing records (log schema < 7): whether "
                                       "its log ends where the run did cannot be told"), res.stderr
