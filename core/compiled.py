"""The compiled kernel: the hot modules of `core/` built by mypyc into C extensions.

One source, two builds. `make` compiles `KERNEL_MODULES` with mypyc (it ships with mypy) into
`build/mypyc/`, with a manifest of the sources' hashes. Importing `deepserve.core` then loads
the compiled modules in place of the .py files, but only while every hash still matches: an
edited source is never shadowed by a stale extension. It runs pure until `make` rebuilds. `DEEPSERVE_PURE=1` forces the pure modules. Both builds write the same log
byte for byte (tests/core/test_compiled.py). `deepserve.core.KERNEL_BUILD` says which one runs,
and the benchmarks print it. Why mypyc, and what it buys: docs/decisions.md (2026-11-26).

Build: `python -c 'import deepserve.core.compiled as c; c.main()'` (what `make` runs).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The modules every delivery runs through. Message, event and record types stay pure: they
# are msgspec Structs, already C.
KERNEL_MODULES = ("mailbox", "cell", "context", "driver", "inline", "sim", "asyncdriver")
CORE_DIR = Path(__file__).resolve().parent
PACKAGE_ROOT = CORE_DIR.parent
BUILD_DIR = PACKAGE_ROOT / "build" / "mypyc"
MANIFEST = "manifest.json"
PURE_ENV = "DEEPSERVE_PURE"


def source_hashes() -> dict[str, str]:
    """sha256 of each kernel module's source, as the build saw it and as it is now."""
    return {
        m: hashlib.sha256((CORE_DIR / f"{m}.py").read_bytes()).hexdigest() for m in KERNEL_MODULES
    }


def _manifest(build_dir: Path) -> dict | None:
    try:
        return json.loads((build_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def select(core_path: list[str], build_dir: Path = BUILD_DIR) -> str:
    """Called once by `deepserve.core` with its `__path__`, before any kernel module is
    imported. Returns "compiled" (the build's directory now comes first on the path), "pure"
    (no build, or `DEEPSERVE_PURE`), or "stale" (a build of other sources: pure runs)."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return "pure"
    manifest = _manifest(build_dir)
    if manifest is None:
        return "pure"
    if manifest.get("python") != sys.implementation.cache_tag:
        return "pure"  # built by another interpreter: its extensions would not load
    if any(manifest["sources"].get(m) != h for m, h in source_hashes().items()):
        # Quietly: a warning on stderr would change what every CLI command prints. The
        # benchmarks print the build they measured (`describe`).
        return "stale"
    _load_group(manifest["group"], build_dir)
    core_path.insert(0, str(build_dir / "deepserve" / "core"))
    return "compiled"


def describe(build: str) -> str:
    """One line for a benchmark's table: which kernel it measured."""
    return {
        "compiled": "kernel: compiled (mypyc)",
        "pure": "kernel: pure Python",
        "stale": "kernel: pure Python (the compiled build is older than core/: run make)",
    }[build]


def _load_group(name: str, build_dir: Path) -> None:
    """mypyc puts the compiled code of all modules in one shared library, a top-level module
    each module's small extension imports by name. Load it from the build directory by path,
    so nothing is added to `sys.path`."""
    if name in sys.modules:
        return
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    spec = importlib.util.spec_from_file_location(name, build_dir / f"{name}{suffix}")
    if spec is None or spec.loader is None:
        raise ImportError(f"compiled kernel: cannot load {name}{suffix} from {build_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)


def build(opt_level: str = "3") -> Path:
    """Compile the kernel into a fresh directory, then swap it in with its manifest."""
    from mypyc.build import mypycify  # type: ignore[import-untyped]  # build time only (dev)
    from setuptools import Distribution  # type: ignore[import-untyped]

    hashes = source_hashes()  # before compiling: a source edited meanwhile reads as stale
    with tempfile.TemporaryDirectory(prefix="deepserve-mypyc-") as tmp:
        # mypyc names modules after directories: compile through a `deepserve` link, since
        # the checkout is rarely called that (the Makefile's mypy does the same).
        (Path(tmp) / "deepserve").symlink_to(PACKAGE_ROOT)
        staging = Path(tmp) / "out"
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            sources = [f"deepserve/core/{m}.py" for m in KERNEL_MODULES]
            options = ["--config-file", str(PACKAGE_ROOT / "pyproject.toml")]
            extensions = mypycify(sources + options, opt_level=opt_level, target_dir="c")
            dist = Distribution({"name": "deepserve-kernel", "ext_modules": extensions})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib, cmd.build_temp, cmd.parallel = str(staging), "o", os.cpu_count() or 1
            dist.run_command("build_ext")
        finally:
            os.chdir(cwd)
        groups = [p.name.split(".")[0] for p in staging.glob("*__mypyc*")]
        if len(groups) != 1:
            raise RuntimeError(f"expected one mypyc group library, found {groups}")
        manifest = {"python": sys.implementation.cache_tag, "group": groups[0], "sources": hashes}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        BUILD_DIR.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), BUILD_DIR)
    return BUILD_DIR


def main() -> int:
    try:
        out = build(os.environ.get("MYPYC_OPT_LEVEL", "3"))
    except (Exception, SystemExit) as exc:  # mypyc exits on a type error; the pure kernel runs
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        print(f"deepserve: compiling the kernel failed ({type(exc).__name__}: {exc}); "
              "the pure Python kernel will run", file=sys.stderr)
        return 0
    print(f"deepserve: compiled kernel in {out}", file=sys.stderr)
    return 0
