"""The compiled build: deepserve's hot modules turned into C extensions by mypyc.

One source, two builds. `make` compiles `COMPILED` with mypyc (it ships with mypy) into
`build/mypyc/`, beside a manifest of the sources' hashes. Importing `deepserve` (this package's
`__init__`) then loads those extensions in place of the .py files, through a finder at the head
of `sys.meta_path`, but only while every hash still matches: an edited source is never shadowed
by a stale extension. All or nothing, since compiled modules call each other's C directly: one
changed module and everything runs pure until `make` rebuilds. `DEEPSERVE_PURE=1` forces pure.

Both builds write the same log byte for byte, a failed handler's traceback text aside
(tests/core/test_compiled.py); `BUILD` says which
one runs, and the benchmarks print it. Why mypyc, and what it buys: docs/decisions.md ("The
kernel is compiled with mypyc"). Build: `python -c 'import deepserve.compiled as c; c.main()'`
(what `make` runs).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

# Groups of modules, one shared library each (groups compile in parallel; a call between two
# groups is an ordinary Python call). Message, event and state types stay pure: they are msgspec
# Structs, C already. FlowServe's and the NPU's hottest modules were tried as further groups and
# left out: the whole-trace simulation got no faster (docs/decisions.md, "Beyond the kernel, a
# module group is compiled only where instructions show a gain"). The NPU's run-chunk loop is a
# group of its own: plain float arithmetic, which mypyc turns into C doubles (the same entry).
# The ZeroMQ transport is one too: its wall-clock gain was lost in the machine's noise when first
# tried (2026-11-26), but it takes ~12k instructions off each side of a round trip (2026-11-27).
GROUPS: dict[str, tuple[str, ...]] = {
    # The kernel: every delivery runs through these.
    "kernel": ("core.codec", "core.envelope", "core.mailbox", "core.cell", "core.pagewriter", "core.steps", "core.context",
               "core.driver", "core.inline", "core.sim", "core.asynctimers", "core.asynclog", "core.asyncremote",
               "core.asyncdriver"),
    # An NPU run chunk's pass ends: one loop over C doubles (npu_loop's docstring).
    "npu": ("adapters.hardware.devices.npu_loop",),
    # The ZeroMQ transport's hot path: a round trip runs the receive drain, the send path and
    # their bookkeeping once a side. Its Structs and its RuntimeError stay pure (zmq/limits.py).
    # (In the kernel's group instead, measured the same: its calls into the kernel are few.)
    "zmq": ("adapters.zmq.peer", "adapters.zmq.transport"),
    # The DP master's per-batch decisions and fold: plain int bookkeeping over the state's
    # Structs once their Python overhead was cut (docs/decisions.md, "Beyond the kernel ...", the
    # "master" group).
    # With its per-pass output: each streamed chunk's emulated tokens (sampling, tokens: 64-bit
    # mixing and the Zipf inversion a token) and the chunk itself (output) — in the daemon a
    # pass's tokens are a few % of its CPU (issue 30 §1, py-spy).
    "master": ("actors.flowserve.master.scheduler", "actors.flowserve.master.runs", "actors.flowserve.master.evolve",
               "actors.flowserve.master.output", "actors.flowserve.sampling", "actors.flowserve.tokens"),
    # A JE routing decision outside its tree walk (issue 29 §4): the pool's reads, combined's
    # sorts and the candidate records it builds. Its Structs stay pure (scheduling/decision.py).
    "routing": ("actors.scheduling.combined", "actors.scheduling.pool", "actors.je.routing"),
}
COMPILED = tuple(m for modules in GROUPS.values() for m in modules)
PACKAGE_ROOT = Path(__file__).resolve().parent
BUILD_DIR = PACKAGE_ROOT / "build" / "mypyc"
MANIFEST = "manifest.json"
PURE_ENV = "DEEPSERVE_PURE"
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def source_hashes() -> dict[str, str]:
    """sha256 of each compiled module's source, as the build saw it and as it is now."""
    return {m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in COMPILED}


def _source(module: str) -> Path:
    return PACKAGE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def check(build_dir: Path = BUILD_DIR) -> str:
    """"compiled" (a build of exactly these sources, for this interpreter), "pure" (no build,
    another interpreter's, or `DEEPSERVE_PURE`) or "stale" (a build of other sources)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return "pure"
    manifest = _manifest(build_dir)
    if manifest.get("python") != sys.implementation.cache_tag:
        return "pure"
    # Quietly: a warning on stderr would change what every CLI command prints.
    # The groups too: a build laid out in other groups has other shared libraries to load.
    current = manifest.get("sources") == source_hashes() and manifest.get("groups") == _groups()
    return "compiled" if current else "stale"


def _groups() -> dict[str, list[str]]:
    """`GROUPS` as the manifest's JSON holds it."""
    return {g: list(ms) for g, ms in GROUPS.items()}


def _manifest(build_dir: Path = BUILD_DIR) -> dict:
    try:
        manifest = json.loads((build_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _mypyc_version() -> str:
    from mypy.version import __version__  # build time only (dev)

    return __version__


class CompiledFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled extension of each module in `COMPILED`, and nothing else."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = build_dir
        self.names = {f"deepserve.{m}" for m in COMPILED}

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.build_dir.joinpath(*fullname.split(".")).with_name(
                fullname.rsplit(".", 1)[1] + SUFFIX))


def install(build_dir: Path = BUILD_DIR) -> str:
    """Called once by `deepserve/__init__.py`, before any other deepserve module is imported."""
    build = check(build_dir)
    if build == "compiled":
        for group in GROUPS:
            if GROUPS[group]:
                _load_group(f"deepserve_{group}__mypyc", build_dir)
        sys.meta_path.insert(0, CompiledFinder(build_dir))
    return build


def describe(build: str) -> str:
    """One line for a benchmark's table: which build it measured."""
    return {
        "compiled": "build: compiled (mypyc)",
        "pure": "build: pure Python",
        "stale": "build: pure Python (the compiled build is older than the sources: run make)",
    }[build]


def _load_group(name: str, build_dir: Path) -> None:
    """A group's shared library is a top-level module that each of its modules' small
    extensions imports by name: load it from the build directory by path, so nothing is added
    to `sys.path`."""
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, build_dir / f"{name}{SUFFIX}")
    if spec is None or spec.loader is None:
        raise ImportError(f"compiled build: cannot load {name}{SUFFIX} from {build_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def build(opt_level: str = "3") -> Path:
    """Compile every group into a fresh directory, then swap it in with its manifest."""
    # build time only (mypy is a dev dependency); older mypy releases ship no types for these
    from mypyc.build import mypycify  # type: ignore[import-untyped, unused-ignore]
    from setuptools import Distribution  # type: ignore[import-untyped, unused-ignore]

    hashes = source_hashes()  # before compiling: a source edited meanwhile reads as stale
    with tempfile.TemporaryDirectory(prefix="deepserve-mypyc-") as tmp:
        # mypyc names modules after directories: compile through a `deepserve` link, since
        # the checkout is rarely called that (the Makefile's mypy does the same).
        (Path(tmp) / "deepserve").symlink_to(PACKAGE_ROOT)
        staging = Path(tmp) / "out"
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            def files(modules: tuple[str, ...]) -> list[str]:
                return [f"deepserve/{m.replace('.', '/')}.py" for m in modules]

            groups: list[tuple[list[str], str | None]] = [
                (files(ms), f"deepserve_{g}") for g, ms in GROUPS.items() if ms]
            options = ["--config-file", str(PACKAGE_ROOT / "pyproject.toml")]
            extensions = mypycify(files(COMPILED) + options, opt_level=opt_level,
                                  separate=groups, target_dir="c")
            dist = Distribution({"name": "deepserve-compiled", "ext_modules": extensions})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib, cmd.build_temp, cmd.parallel = str(staging), "o", os.cpu_count() or 1
            dist.run_command("build_ext")
        finally:
            os.chdir(cwd)
        manifest = {"python": sys.implementation.cache_tag, "sources": hashes, "groups": _groups(),
                    "mypyc": _mypyc_version()}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        BUILD_DIR.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), BUILD_DIR)
    return BUILD_DIR


def main() -> int:
    """`make`'s step: build unless the build in place is of exactly these sources, by the
    mypyc installed now (an upgrade of mypy rebuilds)."""
    if os.environ.get(PURE_ENV, "") in ("", "0") and check() == "compiled":
        if _manifest().get("mypyc") == _mypyc_version():
            return 0
    print(f"deepserve: compiling {len(COMPILED)} modules with mypyc (compiled.py) ...",
          file=sys.stderr, flush=True)
    try:
        out = build(os.environ.get("MYPYC_OPT_LEVEL", "3"))
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error; pure Python runs
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        print(f"deepserve: compiling failed ({type(exc).__name__}: {exc}); "
              "the pure Python build will run", file=sys.stderr)
        return 0
    print(f"deepserve: compiled build in {out}", file=sys.stderr)
    return 0
