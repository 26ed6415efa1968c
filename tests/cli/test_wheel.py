"""The package as a user gets it (issue 29 §3): a wheel built from the checkout, installed into a
fresh venv outside it, holds every module and data file of the source tree and nothing else,
imports every module, and serves a request with `deepserve up --processes`.

Nothing is downloaded: the wheel is built by the project venv's setuptools (the dev extra's)
with setuptools' warnings as errors (the build warns of nothing of the project's making), and
the fresh venv sees the project venv's dependencies through a .pth (a plain path entry: the
editable install's finder there is not activated by it)."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import httpx2 as httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
# What setup.py and pyproject.toml promise: every directory is a package but these and those with a
# dot in the name (.venv, *.egg-info), and every file of the data kinds ships beside the code.
NOT_PACKAGES = {"tests", "docs", "build", "runs", "dist", "__pycache__"}
DATA = ("*.toml", "*.csv", "*.jsonl", "*.json", "*.md", "*.txt")
# Whatever a working checkout holds besides its sources: not copied into the build's tree.
SCRATCH = (".git", ".venv", "build", "runs", "dist", "*.egg-info", "__pycache__", ".*cache", ".hypothesis", "*.db*")
# One TE: the daemon starts in about a second, and its one process beside the others is enough.
UP = ("--processes", "--port", "0", "--set", "cluster.tes=1", "--set", "pd.prefill_tes=0", "--set", "pd.decode_tes=0",
      "--set", "control.spare_tes=0", "--set", "control.pod_start_s=0.05", "--set", "control.te_preload_s=0.05")  # fmt: skip
START_TIMEOUT_S = 60


def _build_tooling_missing() -> str:
    """Why the wheel cannot be built and installed here ("" when it can). Versions only: importing
    setuptools in the test process would replace distutils under whoever imported it."""
    try:
        setuptools, pip = version("setuptools"), version("pip")
    except PackageNotFoundError as exc:
        return f"{exc.name} is not installed (pip install -e '.[dev]')"
    if _major_minor(setuptools) < (70, 1) and shutil.which("wheel") is None:  # bdist_wheel: built in since 70.1
        return f"setuptools {setuptools} cannot build a wheel without `wheel`"
    if _major_minor(pip) < (22, 3):  # `pip --python`
        return f"pip {pip} cannot install into another environment (needs 22.3)"
    return ""


def _major_minor(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".")[:2])


pytestmark = pytest.mark.skipif(bool(_build_tooling_missing()), reason=_build_tooling_missing() or "-")


def _expected(src: Path) -> set[str]:
    """The wheel's files under deepserve/, read off the source tree by the rule it promises."""
    found = set()
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        if not path.is_file() or len(rel.parts) == 1:  # the root's files are the project's, not data
            continue
        dirs = rel.parts[:-1]
        if dirs[0] in NOT_PACKAGES or any("." in d or d == "__pycache__" for d in dirs):
            continue
        if path.suffix == ".py" or any(fnmatch.fnmatch(path.name, g) for g in DATA):
            found.add(rel.as_posix())
    return found | {f"{name}.py" for name in ("__init__", "__main__", "cmdline", "compiled", "lazy")}


def _build(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SCRATCH))
    # What a working checkout makes must not ship: a run directory, mypyc's build, a venv.
    for decoy in ("runs/r/__init__.py", "build/mypyc/x.py", ".venv/lib/site/__init__.py"):
        (src / decoy).parent.mkdir(parents=True, exist_ok=True)
        (src / decoy).write_text("")
    dist = tmp / "dist"
    # setuptools' own warnings (about the project's configuration) fail the build; other
    # libraries' deprecations under a newer Python are not this project's to fix.
    code = ("import warnings; from setuptools.warnings import SetuptoolsWarning; "
            "warnings.simplefilter('error', SetuptoolsWarning); "
            f"from setuptools import build_meta as b; print(b.build_wheel({str(dist)!r}))")
    res = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return dist / res.stdout.strip().splitlines()[-1]


def _venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()  # fmt: skip
    Path(purelib, "project-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    res = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                          "--no-index", str(wheel)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return venv


IMPORT_ALL = """
import importlib, json, pathlib, sys
import deepserve
root = pathlib.Path(deepserve.__file__).parent
names = sorted(".".join(("deepserve",) + p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
               for p in root.rglob("*.py") if p.name != "__main__.py")
for name in names:  # __main__ would run the command line: `deepserve` below runs it
    importlib.import_module(name)
print(json.dumps({"root": str(root), "modules": len(names)}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DEEPSERVE_DEBUG")}
    return {**env, "PYTHONUNBUFFERED": "1"}


def test_the_wheel_installs_imports_every_module_and_serves_with_processes(tmp_path: Path) -> None:
    wheel = _build(tmp_path)
    src = tmp_path / "src"
    with zipfile.ZipFile(wheel) as z:
        shipped = {n.removeprefix("deepserve/") for n in z.namelist() if n.startswith("deepserve/")}
    assert shipped == _expected(src), (sorted(shipped - _expected(src)), sorted(_expected(src) - shipped))
    assert "adapters/zmq/transport.py" in shipped and "configs/daemon/default.toml" in shipped

    venv = _venv(tmp_path, wheel)
    away = tmp_path / "elsewhere"  # outside the checkout: nothing found by the working directory
    away.mkdir()
    run_dir = away / "run"
    out = open(away / "up.out", "w")
    proc = subprocess.Popen([venv / "bin" / "deepserve", "up", *UP, "--run-dir", str(run_dir)], cwd=away, env=_env(),
                            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    out.close()
    try:  # every module imported while the daemon starts
        res = subprocess.run([venv / "bin" / "python", "-c", IMPORT_ALL], cwd=away, env=_env(), capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert res.returncode == 0, res.stderr[-3000:]
        imported = json.loads(res.stdout.splitlines()[-1])
        assert Path(imported["root"]).is_relative_to(venv), imported
        assert imported["modules"] == sum(1 for f in shipped if f.endswith(".py") and not f.endswith("__main__.py"))

        info = _wait_started(proc, run_dir / "daemon.json", away / "up.out")
        body = {"model": "llama3-8b", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}
        reply = httpx.post(info["url"] + "/v1/completions", json=body, timeout=START_TIMEOUT_S)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4, reply.text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (away / "up.out").read_text()[-3000:]


def _wait_started(proc: subprocess.Popen[bytes], info_path: Path, out: Path) -> dict[str, str]:
    end = time.monotonic() + START_TIMEOUT_S
    while not info_path.exists():
        assert proc.poll() is None and time.monotonic() < end, f"the daemon did not start: {out.read_text()[-3000:]}"
        time.sleep(0.05)
    return json.loads(info_path.read_text())
