"""Load the one config (`schema.py`) for `sim` or `up`: a built-in scenario name or a TOML file,
then `--set KEY=VALUE` overrides, through one path (TOML → dict → overrides → `msgspec.convert`
→ the cross-field rules), every error a `ScenarioError` naming the dotted key and the file or
override that set it.

What a file lacks takes defaults, so every file works with both commands: a scenario file has no
`[daemon]` (the HTTP defaults), a daemon file no `[workload]` (the built-in Azure conversation
trace). One difference, kept from before: `up` layers a file that is not a scenario (no top-level
`name`, no `[workload]`) over the daemon's default (configs/daemon/default.toml), so a daemon file
names only what it changes; a scenario describes its whole cluster. With no file, both commands
take the daemon's default.

`for_driver` is what each driver sets itself rather than refusing a file for it: `up` steps
every decode iteration and streams token ids (the frontend renders them); `sim` streams none.
Heartbeats run beside aggregated decode runs: a master inside one says so and its NPU is probed
instead (actors/cluster/liveness.py), so a busy master is not taken for a stalled one.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import msgspec

from deepserve.adapters.scenario.loader import (
    MAX_OVERRIDES,
    ScenarioError,
    _key_of,
    _read,
    apply_override,
    builtin_names,
    parse_override,
    parse_toml,
    read_text_file,
    source_of,
)

from .schema import PlatformConfig, check

Command = Literal["sim", "up"]
DEFAULT_SOURCE = "configs/daemon/default.toml"
Override = str | tuple[str, str]  # KEY=VALUE, or (KEY=VALUE, the flag that set it)


class Invalid(Exception):
    """A problem at `key`; `also`: other keys it is about (the origin may be where either was set)."""

    def __init__(self, key: str, problem: str, also: tuple[str, ...] = ()) -> None:
        self.key, self.problem, self.also = key, problem, also


def default_text() -> tuple[str, str]:
    res = resources.files("deepserve") / "configs" / "daemon" / "default.toml"
    return DEFAULT_SOURCE, res.read_text(encoding="utf-8")


def is_scenario(doc: dict[str, Any]) -> bool:
    return "name" in doc or "workload" in doc


def read_file(path: str) -> tuple[str, str]:
    """(source, text) of a config file named by path (the daemon's messages)."""
    return path, read_text_file(path)


def layer(base: dict[str, Any], top: dict[str, Any], prefix: str = "") -> list[str]:
    """Merge `top` into `base` in place (tables key by key); the dotted keys `top` set."""
    keys: list[str] = []
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            keys += layer(base[k], v, f"{prefix}{k}.")
        else:
            base[k] = v
            keys.append(prefix + k)
    return keys


def load_doc(spec: str | None, overrides: Sequence[Override], command: Command) -> tuple[dict[str, Any], dict[str, str], str]:
    """(the document, dotted key -> the file or override that set it, the file's source)."""
    if len(overrides) > MAX_OVERRIDES:
        raise ScenarioError("--set", "", f"at most {MAX_OVERRIDES} overrides")
    labels: dict[str, str] = {}
    if spec is None:
        source, text = default_text()
        doc = parse_toml(source, text)
    else:
        if command == "up" and not (spec in builtin_names() and not Path(spec).exists()):
            source, text = read_file(spec)
        else:
            source, text = _read(spec)
        doc = parse_toml(source, text)
        if command == "up" and not is_scenario(doc):
            base_source, base = default_text()
            top, doc = doc, parse_toml(base_source, base)
            labels.update(dict.fromkeys(layer(doc, top), source))
    for entry in overrides:
        item, label = (entry, f"--set {entry}") if isinstance(entry, str) else entry
        key, value = parse_override(item)
        apply_override(doc, key, value, label)
        labels[key] = label
    return doc, labels, source


def validated(doc: dict[str, Any]) -> PlatformConfig:
    """The document as a config, every rule checked; else `Invalid` naming the key."""
    try:
        cfg = msgspec.convert(doc, PlatformConfig)
    except msgspec.ValidationError as exc:
        raise Invalid(*_key_of(exc)) from None
    from deepserve.adapters.hardware.models import known_models

    for key, problem in check(cfg, known_models()):
        raise Invalid(key, problem)
    return cfg


def origin(bad: Invalid, labels: dict[str, str], fallback: str) -> str:
    """The last file or override that set the bad key, else one the problem is also about."""
    return next((o for o in (source_of(k, labels, "") for k in (bad.key, *bad.also)) if o), fallback)


def load(spec: str | None, overrides: Sequence[Override] = (), command: Command = "sim") -> PlatformConfig:
    """The validated config named or stored at `spec` (None: the daemon's default), with
    `overrides` applied (a `--seed` is the override `seed=N`)."""
    doc, labels, source = load_doc(spec, overrides, command)
    try:
        return validated(doc)
    except Invalid as bad:
        raise ScenarioError(origin(bad, labels, source), bad.key, bad.problem) from None


def _each_group(cfg: PlatformConfig, **scheduler: Any) -> PlatformConfig:
    def fix(c: Any) -> Any:
        return msgspec.structs.replace(c, scheduler=msgspec.structs.replace(c.scheduler, **scheduler))

    return msgspec.structs.replace(cfg, cluster=fix(cfg.cluster), groups=tuple(fix(g) for g in cfg.groups))


def for_driver(cfg: PlatformConfig, command: Command) -> PlatformConfig:
    """The config as `command`'s driver runs it (see the module docstring)."""
    if command == "up":
        return _each_group(cfg, aggregate=False, stream_token_ids=True)
    cfg = _each_group(cfg, stream_token_ids=False)
    return cfg
