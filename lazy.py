"""Package exports that load on first use (PEP 562), for package `__init__`s whose
submodules are costly to import (SQLAlchemy, the log factory): `deepserve.persistence`
(a child process imports one of its submodules and must not pay for the rest) and
`deepserve.replay` (the CLI needs its error type on every command)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__`: `exports` maps a name to the submodule (relative to
    `package`) that defines it; the first access imports it and caches the value in
    `namespace` (the package's globals), so later accesses are plain lookups."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    return __getattr__
