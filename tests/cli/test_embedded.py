"""A pipeline embedded in the user's own script: logged, then verified from the CLI.

Actors defined in a script run as `__main__` are logged under the script's importable
name (`python dir/app.py` -> "app", `python -m pkg.app` -> "pkg.app"), and `deepserve
replay --path DIR` / `--import MODULE` makes them loadable.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve

SCRIPT = textwrap.dedent(
    """
    import sys

    from deepserve.core import Actor, Event, Message, SimDriver
    from deepserve.persistence import open_sink


    class Hello(Message, frozen=True):
        name: str


    class Greeted(Event, frozen=True):
        name: str


    class Greeter(Actor[list]):
        def initial_state(self):
            return []

        def evolve(self, state, event):
            return [*state, event.name]

        def handle(self, ctx, msg):
            ctx.record(Greeted(msg.name))
            ctx.send("ext/out", Hello(msg.name.upper()))


    def main(log):
        sink = open_sink(log, "async")
        sim = SimDriver(seed=3, sink=sink)
        sim.spawn("greeter", Greeter)
        for t, who in [(0.5, "ada"), (2.0, "alan"), (3.5, "grace")]:
            sim.inject("greeter", Hello(who), at=t)
        sim.run()
        sink.close()
        print(sim.actor("greeter").state)


    if __name__ == "__main__":  # replay imports this file: it must not run the pipeline
        main(sys.argv[1])
    """
)


def _run_script(args: list[str], cwd: Path) -> None:
    res = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "['ada', 'alan', 'grace']\n"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    app = tmp_path / "myapp"
    app.mkdir()
    (app / "greetings.py").write_text(SCRIPT)
    return app


def test_script_run_as_main_verifies_with_path(app_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "greet.db"
    _run_script([str(app_dir / "greetings.py"), str(log)], cwd=tmp_path)

    res = deepserve("replay", "verify", str(log), "--path", str(app_dir), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("identical: 1 actors, 4 inputs"), res.stdout

    res = deepserve("replay", "state", str(log), "--actor", "greeter", "--path", str(app_dir), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert '"grace"' in res.stdout and "3 events folded" in res.stdout

    # The listing names the class by its module, not `__main__`.
    res = deepserve("replay", "log", str(log), "--path", str(app_dir), cwd=tmp_path)
    assert '"cls":"greetings:Greeter"' in res.stdout, res.stdout


def test_without_the_path_the_error_says_what_to_give(app_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "greet.db"
    _run_script([str(app_dir / "greetings.py"), str(log)], cwd=tmp_path)
    res = deepserve("replay", "verify", str(log), cwd=tmp_path)
    assert_one_line_error(res, "greeter#1", "greetings:Greeter", "--path DIR")


def test_module_run_with_dash_m_verifies_with_import(app_dir: Path, tmp_path: Path) -> None:
    (app_dir / "__init__.py").write_text("")
    log = tmp_path / "greet.db"
    _run_script(["-m", "myapp.greetings", str(log)], cwd=tmp_path)
    res = deepserve(
        "replay", "verify", str(log), "--path", str(tmp_path), "--import", "myapp.greetings",
        cwd=tmp_path / "myapp",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("identical"), res.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--path", "no/such/dir"), ["--path no/such/dir", "no such directory"]),
        (("--import", "no_such_module_xyz"), ["--import no_such_module_xyz", "no module named"]),
    ],
)
def test_bad_user_code_arguments(tmp_path: Path, args, needles) -> None:
    res = deepserve("replay", "verify", str(tmp_path / "x.db"), *args, cwd=tmp_path)
    assert_one_line_error(res, *needles)


def test_a_module_that_fails_to_import_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    res = deepserve(
        "replay", "verify", "x.db", "--path", str(tmp_path), "--import", "broken_mod", cwd=tmp_path
    )
    assert_one_line_error(res, "--import broken_mod", "RuntimeError", "boom at import")
