"""`deepserve.lazy.lazy_exports`: a package's exports load on first use, whatever was
imported before. An export named like a submodule of its package came back as that
module once the submodule had been imported directly (the import system binds the
package attribute, so the package's `__getattr__` is never asked): `from
deepserve.replay import verify` then gave a module, depending on import order."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import deepserve

ROOT = Path(deepserve.__file__).parent
PACKAGES = ("persistence", "replay")


def _exports(package: str) -> dict[str, str]:
    text = (ROOT / package / "__init__.py").read_text()
    return dict(re.findall(r'"(\w+)": "\.(\w+)"', text))


@pytest.mark.parametrize("package", PACKAGES)
def test_no_export_is_named_like_a_submodule(package: str) -> None:
    exports = _exports(package)
    assert exports  # the pattern still reads the table
    submodules = {p.stem for p in (ROOT / package).iterdir() if p.suffix == ".py" or p.is_dir()}
    assert sorted(set(exports) & submodules) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_every_export_resolves_after_its_submodule_was_imported_directly(package: str) -> None:
    exports = _exports(package)
    code = "\n".join([
        "import importlib",
        *(f"importlib.import_module('deepserve.{package}.{m}')" for m in sorted(set(exports.values()))),
        f"import deepserve.{package} as pkg",
        "import types",
        f"bad = [n for n in {sorted(exports)!r} if isinstance(getattr(pkg, n), types.ModuleType)]",
        "print(bad)",
    ])  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]"
