"""Naming an actor class in the log ("module:QualName") and loading it back."""

from __future__ import annotations

import importlib
from typing import Any


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class UnknownActorClass(LookupError):
    pass


def load_class(path: str) -> type:
    """Inverse of `class_path`."""
    module_name, _, qualname = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise UnknownActorClass(f"cannot load actor class {path!r}: {exc}") from None
    return obj
