"""A log is data, never code: replay refuses a spawn entry whose class path names anything but an
`Actor` subclass (`os:system` ran its command on `replay verify` and `replay state`), and refuses
to import a module the user did not choose (its top-level code would run), before calling it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve

from deepserve.core.codec import encode
from deepserve.core.messages import HandlerFailed, Started
from deepserve.core.records import DELIVERED, EventRec, InputRec, RunRec, Step
from deepserve.persistence import open_sink


def _spawn_log(path: Path, cls: str, args: dict, *, failed: bool = False) -> None:
    """A log whose one entry spawns actor `evil` from `cls` with `args`, written through the
    public API (what anybody can send an operator). `failed`: the entry also claims the spawn
    failed in the original run (the case replay used to let through to re-execution)."""
    payload = encode(Started(cls=cls, args=args))
    inp = InputRec("evil", 1, 0.0, 1, DELIVERED, "ext/x", 1, None, None, True, "Started", payload)
    events = (EventRec("evil", 1, 0, "HandlerFailed", encode(HandlerFailed(error="boom"))),) if failed else ()
    with open_sink(str(path)) as sink:
        sink.begin_run(RunRec("r", "sim", 0, "{}", "x", "h", 0.0))
        sink.append(Step(inp, events, ()))


@pytest.mark.parametrize("failed", [False, True], ids=["spawned", "spawn-claimed-failed"])
@pytest.mark.parametrize("cls", ["os:system", "subprocess:getoutput"])
def test_a_log_naming_a_function_runs_nothing(tmp_path: Path, cls: str, failed: bool) -> None:
    marker = tmp_path / "owned"
    _spawn_log(tmp_path / "evil.db", cls, {"command" if cls == "os:system" else "cmd": f"touch {marker}"},
               failed=failed)
    for command in (("verify",), ("state", "--actor", "evil")):
        res = deepserve("replay", *command, "evil.db", cwd=tmp_path)
        line = assert_one_line_error(res, "evil#1", repr(cls), "not an Actor subclass")
        assert not marker.exists(), (command, line)


def test_a_log_naming_an_unchosen_module_does_not_import_it(tmp_path: Path) -> None:
    """A module in the working directory (not given with --path) is not imported: its top-level
    code would run. Given with --path, it is the user's choice."""
    marker = tmp_path / "imported"
    (tmp_path / "sidefx.py").write_text(f"open({str(marker)!r}, 'w').close()\nX = 1\n")
    _spawn_log(tmp_path / "evil.db", "sidefx:X", {})
    for command in (("verify",), ("state", "--actor", "evil")):
        res = deepserve("replay", *command, "evil.db", cwd=tmp_path)
        assert_one_line_error(res, "evil#1", "'sidefx:X'", "refusing to import module 'sidefx'", "--path")
        assert not marker.exists()
    for frozen in ("__hello__:X", "antigravity:X", "this:X", "json.__main__:X"):
        _spawn_log(tmp_path / "f.db", frozen, {})
        res = deepserve("replay", "verify", "f.db", cwd=tmp_path)
        assert_one_line_error(res, "evil#1", "refusing to import module")
        assert res.stdout == ""  # __hello__ prints when imported
        os.remove(tmp_path / "f.db")
    res = deepserve("replay", "verify", "evil.db", "--path", str(tmp_path), cwd=tmp_path)
    assert marker.exists()  # the user's choice: imported, and then still refused as no actor
    assert_one_line_error(res, "evil#1", "'sidefx:X', a int, not an Actor subclass")
