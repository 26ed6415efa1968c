"""The admin API is never exposed without a token (issue 29 §1): a non-loopback `daemon.admin_host`
without one is refused before anything is written; the token comes from `$DEEPSERVE_ADMIN_TOKEN` or
`daemon.admin_token_file`, never the command line; it is compared in constant time, redacted in
the log's run record, in `config show` and in the daemon's output; the run directory is 0700 and
every file in it 0600. The refusals call `main()` in this process (no process boundary to test)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx2 as httpx
import pytest
from daemonproc import start_daemon, stop_daemon

from deepserve.cli.main import main
from deepserve.persistence import open_log
from deepserve.replay import verify
from deepserve.replay.digests import digest

TOKEN = "tok-3f9a.b7_c2~d+e/f1=="
SMALL = ("cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0", "control.te_preload_s=0.2")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("deepserve: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPSERVE_ADMIN_TOKEN", raising=False)


@pytest.fixture
def never_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` in this process must refuse before it serves: were it to start, it would fail here
    (exit 3) instead of serving forever."""
    import deepserve.core.asyncdriver

    def started(*_: object) -> None:
        raise AssertionError("the daemon started")

    monkeypatch.setattr(deepserve.core.asyncdriver, "run", started)


@pytest.mark.usefixtures("never_serve")
def test_an_admin_api_beyond_loopback_without_a_token_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    run_dir = tmp_path / "run"
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.com"):
        code, _, err = run_cli(capsys, "up", "--port", "0", "--run-dir", str(run_dir), "--set", f"daemon.admin_host={host}")
        one_line(code, err, "daemon.admin_host", "daemon.admin_token", host)
        assert not run_dir.exists()
    # a token on the command line is refused too (`ps` shows it to every user): the flag and the --set
    for item in (f"daemon.admin_token={TOKEN}", f'daemon={{admin_token="{TOKEN}"}}'):  # an inline table too
        code, _, err = run_cli(capsys, "up", "--port", "0", "--run-dir", str(run_dir), "--set", item)
        one_line(code, err, "--set daemon.admin_token", "DEEPSERVE_ADMIN_TOKEN", "daemon.admin_token_file")
        assert TOKEN not in err and not run_dir.exists()
    code, _, err = run_cli(capsys, "status", "--admin-url", "http://127.0.0.1:9", "--token", TOKEN)
    one_line(code, err, "--token", "DEEPSERVE_ADMIN_TOKEN", "--token-file")
    # a token file that cannot be used, or two sources that disagree: named, before anything is written
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, needle in ((tmp_path / "missing", "No such file"), (empty, "empty")):
        code, _, err = run_cli(capsys, "up", "--port", "0", "--run-dir", str(run_dir),
                               "--set", f"daemon.admin_token_file={path}")  # fmt: skip
        one_line(code, err, f"daemon.admin_token_file {path}", needle)
    good = tmp_path / "token"
    good.write_text(TOKEN + "\n")
    monkeypatch.setenv("DEEPSERVE_ADMIN_TOKEN", "another")
    code, _, err = run_cli(capsys, "up", "--port", "0", "--run-dir", str(run_dir), "--set", f"daemon.admin_token_file={good}")
    one_line(code, err, "DEEPSERVE_ADMIN_TOKEN", "daemon.admin_token_file", "different")
    assert TOKEN not in err and "another" not in err and not run_dir.exists()


def test_config_show_redacts_the_token(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "daemon.toml"
    cfg.write_text(f'[daemon]\nadmin_token = "{TOKEN}"\nadmin_host = "0.0.0.0"\n')
    code, out, err = run_cli(capsys, "config", "show", "--config", str(cfg))
    assert code == 0, err
    assert 'admin_token = "<redacted>"' in out and TOKEN not in out
    cfg.write_text('[daemon]\nadmin_token = "two words"\n')  # not what a Bearer header carries
    code, _, err = run_cli(capsys, "config", "show", "--config", str(cfg))
    one_line(code, err, "daemon.admin_token", str(cfg))
    assert "two words" not in err


def test_the_token_from_a_file_guards_an_exposed_admin_api(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    run_dir = tmp_path / "run"
    settings = (*SMALL, "daemon.admin_host=0.0.0.0", f"daemon.admin_token_file={token_file}")
    proc, info = start_daemon(run_dir, *[a for s in settings for a in ("--set", s)])
    admin = info["admin_url"].replace("0.0.0.0", "127.0.0.1")
    try:
        bare = httpx.get(admin + "/admin/status", timeout=10)
        assert bare.status_code == 401 and bare.headers["www-authenticate"] == "Bearer"
        for wrong in ("Bearer nope", f"Bearer {TOKEN}x", f"bearer {TOKEN}", TOKEN, "Bearer \u00e9".encode("latin-1")):
            r = httpx.get(admin + "/admin/status", headers={"Authorization": wrong}, timeout=10)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (wrong, r.text)
        ok = httpx.get(admin + "/admin/status", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert ok.status_code == 200 and ok.json()["tes"], ok.text
        # the clients send it from $DEEPSERVE_ADMIN_TOKEN or --token-file
        code, _, err = run_cli(capsys, "status", "--admin-url", admin)
        one_line(code, err, "admin API 401", "DEEPSERVE_ADMIN_TOKEN")
        code, out, err = run_cli(capsys, "status", "--admin-url", admin, "--token-file", str(token_file))
        assert code == 0 and "te/0" in out, err
        monkeypatch.setenv("DEEPSERVE_ADMIN_TOKEN", TOKEN)
        code, out, err = run_cli(capsys, "status", "--admin-url", admin, "--json")
        assert code == 0 and json.loads(out)["tes"][0]["te"] == "te/0", err
        monkeypatch.setenv("DEEPSERVE_ADMIN_TOKEN", "wrong")
        code, _, err = run_cli(capsys, "fault", "hang-npu", "hw/s0/npu0", "--admin-url", admin)
        one_line(code, err, "admin API 401")
        # the user's alone: the run directory 0700, every file in it 0600 (the SQLite -wal/-shm too)
        assert mode(run_dir) == 0o700
        files = [p for p in run_dir.iterdir()]
        assert {p.name for p in files} >= {"daemon.db", "daemon.json"}
        assert {p.name: mode(p) for p in files} == {p.name: 0o600 for p in files}
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    assert TOKEN not in out  # the daemon's stdout and structlog output
    for p in run_dir.iterdir():  # the log's run record included
        assert TOKEN.encode() not in p.read_bytes(), p
    log = open_log(info["log"])
    try:
        config = json.loads(log.runs()[-1].config)
        assert config["daemon"]["admin_token"] == "<redacted>"  # a token was required; which is not logged
        assert config["daemon"]["admin_token_file"] == str(token_file)
        assert verify(log).identical  # replay needs no token: the run record is data
        assert len(digest(log)) == 64
    finally:
        log.close()


def test_the_logged_config_and_the_daemons_output_hold_no_token(capsys: pytest.CaptureFixture[str]) -> None:
    """The run record's config (and so the run digest, which covers it) is the same whatever the
    token: it says a token was required, not which; structlog output redacts the token."""
    import msgspec
    import structlog

    from deepserve.daemon.auth import redacted
    from deepserve.daemon.config import load_config
    from deepserve.daemon.server import configure_logging

    cfg = load_config()
    one, other = (msgspec.json.encode(redacted(cfg, t)) for t in (TOKEN, "another-token"))
    assert one == other and TOKEN.encode() not in one
    assert msgspec.json.encode(redacted(cfg, "")) != one  # whether a token was required: recorded
    configure_logging("json", (TOKEN,))
    try:
        structlog.get_logger("test").info("oops", header=f"Bearer {TOKEN}", nested={"token": TOKEN}, n=1)
    finally:
        structlog.reset_defaults()
    line = json.loads(capsys.readouterr().err)
    assert line["header"] == "Bearer <redacted>" and TOKEN not in line["nested"] and line["n"] == 1, line
