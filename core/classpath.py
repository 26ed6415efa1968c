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


class RefusedClass(ValueError):
    """A class path that names something replay must not call or import: not an `Actor`
    subclass (`os:system`), or in a module the user did not choose to run (a log is data)."""


# Directories and modules the user chose to run code from (`deepserve replay --path DIR`,
# `--import MODULE`): a class path read from a log may import modules found there.
_USER_DIRS: list[str] = []
_USER_MODULES: set[str] = set()


def trust_directory(directory: str) -> None:
    _USER_DIRS.append(os.path.realpath(directory))


def trust_module(name: str) -> None:
    _USER_MODULES.add(name)


def load_class(path: str) -> type:
    """Inverse of `class_path`, for an `Actor` subclass only: anything else a path names (a
    function such as `os:system`, a non-actor class) is refused before it can be called."""
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
    from .actor import Actor  # here: actor.py imports this module

    if not (isinstance(obj, type) and issubclass(obj, Actor)):
        what = f"class {obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else type(obj).__name__
        raise RefusedClass(f"{path!r}, a {what}, not an Actor subclass: refusing to call it")
    return obj


def load_logged_class(path: str) -> type:
    """`load_class` for a class path read from a log, which is data: the module is imported only
    if it is loaded already, is deepserve's own, or lies where the user put their code (`--path`
    directories, PYTHONPATH entries, `--import` modules and their submodules). Importing any
    other module runs its top-level code (`antigravity` opens a browser), so it is refused
    without importing it. Raises `RefusedClass` or `UnknownActorClass`."""
    module_name, colon, qualname = path.partition(":")
    if not colon or not module_name or not qualname:
        raise RefusedClass(f"{path!r}, not a class path (module:QualName)")
    if module_name not in sys.modules and module_name != main_module_name():
        problem = _import_problem(module_name)
        if problem:
            raise RefusedClass(f"{path!r}: refusing to import module {module_name!r}, {problem}")
    return load_class(path)


def _import_problem(module_name: str) -> str | None:
    """Why replay must not import `module_name` (None: it may)."""
    import importlib.util

    parts = module_name.split(".")
    if "__main__" in parts:
        return "a __main__ module, which runs a program when imported"
    if not all(p.isidentifier() for p in parts):
        return "which is not a module name"
    if parts[0] == "deepserve":
        return None
    if any(".".join(parts[:i]) in _USER_MODULES for i in range(1, len(parts) + 1)):
        return None
    # Where the import would find the top-level package: every finder asked, no code run (a
    # top-level name has no parent package to import). Frozen and built-in modules (`__hello__`
    # prints when imported) have no place on disk and are refused with the rest.
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None  # nothing to import: the import fails with its own error
    places = [spec.origin] if spec.has_location and spec.origin else list(spec.submodule_search_locations or [])
    user_dirs = _USER_DIRS + [os.path.realpath(d) for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) if d]
    for place in places:
        real = os.path.realpath(place)
        if any(real.startswith(d.rstrip(os.sep) + os.sep) for d in user_dirs):
            return None
    return ("neither deepserve's nor in a directory given with --path DIR or PYTHONPATH "
            "(import it with --import MODULE if you trust it)")
