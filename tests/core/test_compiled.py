"""The compiled build (compiled.py) is the pure one, faster: the same seed writes the same
log byte for byte under both builds, each verifies the other's log, and a build of other
sources is never loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import deepserve
from deepserve import compiled

HERE = Path(__file__).resolve().parent
needs_build = pytest.mark.skipif(
    deepserve.BUILD != "compiled",
    reason=f"deepserve runs {deepserve.BUILD} Python here: `make` builds the compiled one",
)


def _python(code: str, tmp: Path, *, pure: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop(compiled.PURE_ENV, None)
    if pure:
        env[compiled.PURE_ENV] = "1"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp, capture_output=True, text=True, timeout=120
    )


def _cli(*commands: list[str], tmp: Path, pure: bool, before: str = "") -> list[str]:
    """Run `deepserve` commands in one process (`before` runs first); each one's output."""
    code = before + "\nimport io, contextlib\nfrom deepserve.cli import main\n"
    for args in commands:
        code += (f"out = io.StringIO()\nwith contextlib.redirect_stdout(out): rc = main({args!r})\n"
                 "assert rc == 0, rc\nprint(repr(out.getvalue()))\n")
    done = _python(code, tmp, pure=pure)
    assert done.returncode == 0, done.stdout + done.stderr
    return [eval(line) for line in done.stdout.splitlines()]


@needs_build
def test_both_builds_say_which_they_are(tmp_path: Path) -> None:
    code = "import deepserve, deepserve.core.cell as m; print(deepserve.BUILD, m.__file__)"
    pure = _python(code, tmp_path, pure=True).stdout.split()
    fast = _python(code, tmp_path, pure=False).stdout.split()
    assert pure[0] == "pure" and pure[1].endswith("core/cell.py")
    assert fast[0] == "compiled" and fast[1].startswith(str(compiled.BUILD_DIR))


@needs_build
def test_random_networks_log_the_same_bytes_and_cross_verify(tmp_path: Path) -> None:
    """Asks, timers, spawns, stops and failing handlers under supervision (tests/core/netactors)."""
    digests: dict[bool, str] = {}
    for pure in (True, False):
        log = tmp_path / f"net-{'pure' if pure else 'compiled'}.db"
        write = f"import netactors; netactors.write_log({str(log)!r}, 5, 11, 40)"
        digests[pure] = _cli(["replay", "digest", str(log)], tmp=tmp_path, pure=pure, before=write)[0].strip()
        # the other build re-executes this build's log
        verified = _cli(["replay", "verify", str(log)], tmp=tmp_path, pure=not pure)[0]
        assert verified.startswith("identical: "), verified
    assert digests[True] == digests[False] and len(digests[True]) == 64


@needs_build
@pytest.mark.parametrize("scenario", [["pd-1p1d", "--requests", "60"],
                                      ["mooncake-16te", "--requests", "150"]])
def test_a_simulation_logs_the_same_bytes(tmp_path: Path, scenario: list[str]) -> None:
    """The platform on SimDriver (TEs, DP masters, RTC, DistFlow, NPUs, fabric): its whole log."""
    runs = []
    for pure in (True, False):
        log = str(tmp_path / f"sim-{pure}.db")
        sim = ["sim", *scenario, "--seed", "3", "--log", log, "--json"]
        summary, digest = _cli(sim, ["replay", "digest", log], tmp=tmp_path, pure=pure)
        runs.append((json.loads(summary)["completed"], digest))
    assert runs[0] == runs[1] and runs[0][0] > 0


def _fake_build(tmp_path: Path, **change: object) -> Path:
    """A build directory whose manifest matches today's sources, then `change`d."""
    manifest = {"python": sys.implementation.cache_tag, "sources": compiled.source_hashes(),
                "groups": {g: list(ms) for g, ms in compiled.GROUPS.items()}}
    manifest.update(change)
    build = tmp_path / "build"
    build.mkdir()
    (build / compiled.MANIFEST).write_text(json.dumps(manifest))
    return build


def test_a_build_of_other_sources_is_not_loaded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(compiled.PURE_ENV, raising=False)  # (the suite may run with it set)
    hashes = compiled.source_hashes()
    assert compiled.check(_fake_build(tmp_path)) == "compiled"
    shutil.rmtree(tmp_path / "build")
    assert compiled.check(_fake_build(tmp_path, sources={**hashes, "core.cell": "0" * 64})) == "stale"
    shutil.rmtree(tmp_path / "build")
    missing = {m: h for m, h in hashes.items() if m != "core.cell"}  # a module added since
    assert compiled.check(_fake_build(tmp_path, sources=missing)) == "stale"
    shutil.rmtree(tmp_path / "build")
    # the same sources in other groups: other shared libraries (loading them failed on import)
    regrouped = {"all": [m for ms in compiled.GROUPS.values() for m in ms]}
    assert compiled.check(_fake_build(tmp_path, groups=regrouped)) == "stale"
    assert "older than the sources" in compiled.describe("stale")


def test_a_build_for_another_interpreter_or_none_is_not_loaded(tmp_path: Path, monkeypatch) -> None:
    assert compiled.check(_fake_build(tmp_path, python="cpython-399")) == "pure"
    assert compiled.check(tmp_path / "no-such-build") == "pure"
    shutil.rmtree(tmp_path / "build")
    monkeypatch.setenv(compiled.PURE_ENV, "1")
    assert compiled.check(_fake_build(tmp_path)) == "pure"


def test_the_finder_serves_only_the_compiled_modules(tmp_path: Path) -> None:
    finder = compiled.CompiledFinder(tmp_path)
    spec = finder.find_spec("deepserve.core.cell")
    assert spec is not None and spec.origin == str(tmp_path / "deepserve" / "core" / f"cell{compiled.SUFFIX}")
    assert finder.find_spec("deepserve.core.actor") is None  # user actors subclass it: pure
    assert finder.find_spec("cell") is None


@pytest.mark.parametrize("module", compiled.COMPILED)
def test_no_msgspec_struct_is_defined_in_a_compiled_module(module: str) -> None:
    """mypyc keeps a compiled module's annotations in a form msgspec cannot read: a Struct
    defined there decodes `str | None` as `type` (found when `ReplyHandle` lived beside
    `Envelope`). Structs belong in pure modules (messages.py, records.py)."""
    import importlib
    import inspect

    import msgspec

    mod = importlib.import_module(f"deepserve.{module}")
    structs = [name for name, cls in inspect.getmembers(mod, inspect.isclass)
               if cls.__module__ == mod.__name__ and issubclass(cls, msgspec.Struct)]
    assert structs == [], f"{module} defines msgspec Structs {structs}: move them to a pure module"



@needs_build
def test_routing_decisions_are_the_same_in_both_builds(tmp_path: Path) -> None:
    """The routing group (scheduling.combined, scheduling.pool, je.routing): every decision of
    four policies on a mixed group, field for field (a simulated log has no mixed group)."""
    code = "import routedecisions; print(routedecisions.digest())"
    runs = [_python(code, tmp_path, pure=pure) for pure in (True, False)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert runs[0].stdout == runs[1].stdout and len(runs[0].stdout.strip()) == 64
