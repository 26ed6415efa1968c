"""Load a scenario: a built-in name or a TOML file, then `--set KEY=VALUE` overrides.

The file and the overrides go through one path — TOML → dict → overrides applied to the dict →
`msgspec.convert` into `Scenario` → the cross-field rules — so an override is validated exactly
like the file. Every error is a `ScenarioError` naming the dotted key and where the bad value
came from (the file, or the `--set` that put it there).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from .schema import RELATED, Scenario, check

MAX_FILE_BYTES = 1 << 20
MAX_OVERRIDES = 256
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$")
_UNKNOWN = re.compile(r"unknown field `([^`]+)`")


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the source and the dotted key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {problem}" if key else f"{source}: {problem}")


def builtin_names() -> list[str]:
    folder = resources.files("deepserve") / "configs" / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def _read(spec: str) -> tuple[str, str]:
    """(source name for messages, TOML text) of a built-in name or a file path."""
    if spec in builtin_names():
        res = resources.files("deepserve") / "configs" / "scenarios" / f"{spec}.toml"
        return f"scenario {spec}", res.read_text(encoding="utf-8")
    path = Path(spec)
    if not path.suffix and not path.exists():
        known = ", ".join(builtin_names())
        raise ScenarioError(spec, "", f"not a built-in scenario ({known}) nor a file")
    return spec, read_text_file(spec)


def read_text_file(path: str) -> str:
    """A config file's text, bounded; every failure a `ScenarioError` naming the path."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ScenarioError(path, "", f"larger than {MAX_FILE_BYTES} bytes")
        return p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(path, "", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(path, "", f"not UTF-8 text ({exc.reason})") from None


def parse_toml(source: str, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, "", f"invalid TOML: {exc}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """`cluster.tes=8` → ("cluster.tes", 8). The value is read as a TOML value (numbers,
    booleans, quoted strings, arrays); anything else is taken as a bare string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise ScenarioError(f"--set {item}", "", "expected KEY=VALUE with a dotted KEY like cluster.tes")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def apply_override(doc: dict[str, Any], key: str, value: Any, source: str) -> None:
    node = doc
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ScenarioError(source, ".".join(parts[: i + 1]), "is a value, not a table")
        node = child
    node[parts[-1]] = value


def _key_of(exc: msgspec.ValidationError) -> tuple[str, str]:
    text = str(exc)
    m = _AT.match(text)
    path, problem = (m.group(2), m.group(1)) if m else ("", text)
    u = _UNKNOWN.search(problem)
    if u is not None:
        path = f"{path}.{u.group(1)}" if path else u.group(1)
        problem = "unknown key"
    # a dict's value shows as `[...]` (msgspec does not say which key): name the dict
    return path.replace("[...]", "").replace("[", ".").replace("]", ""), problem


def source_of(key: str, labels: dict[str, str], fallback: str) -> str:
    """Where the bad value at `key` came from: the last of `labels` (dotted key -> the file or
    override that set it, in the order they were applied) that set `key` or a table above or
    below it; else the last that set a key the rule reporting `key` also reads (schema.RELATED);
    else `fallback` (the file every other key came from)."""
    for wanted in ((key,), RELATED.get(key, ())):
        for k, label in reversed(labels.items()):
            if any(w == k or w.startswith(k + ".") or k.startswith(w + ".") for w in wanted):
                return label
    return fallback


def load_scenario(spec: str, overrides: Sequence[str] = (), known_models: tuple[str, ...] | None = None) -> Scenario:
    """The validated scenario named or stored at `spec`, with `overrides` applied."""
    if len(overrides) > MAX_OVERRIDES:
        raise ScenarioError("--set", "", f"at most {MAX_OVERRIDES} overrides")
    source, text = _read(spec)
    doc = parse_toml(source, text)
    overridden: dict[str, str] = {}  # dotted key -> the --set that set it
    for item in overrides:
        key, value = parse_override(item)
        apply_override(doc, key, value, f"--set {item}")
        overridden[key] = f"--set {item}"
    try:
        scenario = msgspec.convert(doc, Scenario)
    except msgspec.ValidationError as exc:
        key, problem = _key_of(exc)
        raise ScenarioError(source_of(key, overridden, source), key, problem) from None
    if known_models is None:
        from deepserve.adapters.hardware.models import known_models as _known

        known_models = _known()
    for key, problem in check(scenario, known_models):
        raise ScenarioError(source_of(key, overridden, source), key, problem)
    return scenario


BUILTIN_PREFIX = "builtin:"


def builtin_traces() -> list[str]:
    folder = resources.files("deepserve") / "configs" / "traces"
    return sorted(p.name.rpartition(".")[0] for p in folder.iterdir() if p.name.endswith((".csv", ".jsonl")))


def trace_path(spec: str) -> str:
    """The file a workload's `trace` names: `builtin:NAME` (a shipped slice) or a path."""
    if not spec.startswith(BUILTIN_PREFIX):
        return spec
    name = spec[len(BUILTIN_PREFIX):]
    folder = resources.files("deepserve") / "configs" / "traces"
    for suffix in (".jsonl", ".csv"):
        res = folder / f"{name}{suffix}"
        if res.is_file():
            return str(res)
    raise ScenarioError(
        "workload.trace", "", f"no built-in trace {name!r}; built-in: {', '.join(builtin_traces())}"
    )
