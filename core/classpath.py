"""Naming an actor class in the log ("module:QualName") and loading it back."""

from __future__ import annotations

import os
import sys
from typing import Any


def class_path(cls: type) -> str:
    """"module:QualName", by which replay loads the class. A class of the script run as
    `__main__` is named by the script's importable name where it can be known (see
    `main_module_name`), so that another process can import it."""
    module = cls.__module__
    if module == "__main__":
        module = main_module_name() or module
    return f"{module}:{cls.__qualname__}"


def main_module_name() -> str | None:
    """The name under which the script running as `__main__` can be imported elsewhere:
    `python -m pkg.mod` -> "pkg.mod"; `python dir/script.py` -> "script" (importable
    with `dir` on the path: `deepserve replay --path dir`); None for `python -c`, a REPL."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name and name != "__main__":
        return str(name)
    file = getattr(main, "__file__", None)
    if isinstance(file, str):
        stem = os.path.splitext(os.path.basename(file))[0]
        if stem.isidentifier() and stem != "__main__":
            return stem
    return None


class UnknownActorClass(LookupError):
    pass


def load_class(path: str) -> type:
    """Inverse of `class_path`."""
    import importlib

    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = sys.modules.get(module_name)
        if obj is None and module_name == main_module_name():
            obj = sys.modules["__main__"]  # this process is that script: never import it twice
        if obj is None:
            obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownActorClass(f"cannot load actor class {path!r}: {exc}") from None
    return obj
