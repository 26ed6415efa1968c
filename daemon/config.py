"""The daemon's config: the one platform config (deepserve/cluster/schema.py — `[daemon]`,
`[cluster]`, `[pd]`, `[[groups]]`, `[control]`, `[scheduling]`, ...), loaded for `up`
(cluster/config.py: a file that is not a scenario is layered over configs/daemon/default.toml),
plus what only a daemon checks: its ports, its admin token, its tokenizer. Every error names the
dotted key and the file or override that set it; `resolved_toml()` is what `deepserve config
show` prints."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.cluster.config import Invalid, default_text, for_driver, load_doc, origin, validated
from deepserve.cluster.schema import Daemon, PdPool, PlatformConfig

__all__ = ["DaemonConfig", "Daemon", "PdPool", "default_text", "load_config", "resolved_toml"]

DaemonConfig = PlatformConfig  # one schema for sims and the daemon
_Invalid = Invalid


def load_config(path: str | None = None, overrides: tuple[str | tuple[str, str], ...] = ()) -> DaemonConfig:
    """The validated config as the daemon runs it: the default file, or `path` (a daemon file's
    tables layered over the default, key by key; a scenario file whole), then the overrides.
    Errors name the key, and the file or override that set it. An override is `KEY=VALUE`
    (`--set`), or `(KEY=VALUE, label)` when a flag set it (`("daemon.port=9", "--port 9")`)."""
    doc, labels, source = load_doc(path, overrides, "up")
    try:
        cfg = validated(doc)
        _check_daemon(cfg, labels)
    except Invalid as bad:
        raise ScenarioError(origin(bad, labels, source), bad.key, bad.problem) from None
    return for_driver(cfg, "up")


def _check_daemon(cfg: DaemonConfig, labels: dict[str, str]) -> None:
    _check_ports(cfg.daemon)
    _check_token(cfg.daemon)
    if cfg.daemon.tokenizer != "approx":
        from deepserve.adapters.tokenizer import make_tokenizer

        try:
            make_tokenizer(cfg.daemon.tokenizer)  # a missing file or package: refused now, not at start
        except ValueError as exc:
            raise Invalid("daemon.tokenizer", str(exc).removeprefix("tokenizer: ")) from None
    if cfg.scheduling.entry != "gateway":
        raise Invalid("scheduling.entry", "the daemon's requests enter through the gateway (dispatcher: sim only)")
    # What the daemon sets itself (cluster/config.py `for_driver`) is refused only when a file or
    # an override asked for the opposite: a scenario file's defaults are not the user's words.
    said = {k for k in labels if k.endswith(("scheduler.aggregate", "scheduler.stream_token_ids"))}
    for key in sorted(said):
        # (a `[[groups]]` table is set whole, from a file: its scheduler's keys are never said alone)
        table = cfg.cluster if key.startswith("cluster.") else None
        value = getattr(table.scheduler, key.rpartition(".")[2]) if table is not None else None
        if key.endswith("aggregate") and value is True:
            # Heartbeats are not the reason (a master inside an aggregated run says so and its NPU
            # is probed: actors/cluster/liveness.py); streaming is: the frontend gets each pass's
            # tokens as the pass ends, which an aggregated run (several passes, one NPU request) has not
            raise Invalid(key, "must be false: the daemon steps every decode pass to stream its tokens "
                               "(aggregated runs are the simulation's fast path)")  # fmt: skip
        if key.endswith("stream_token_ids") and value is False:
            raise Invalid(key, "the daemon needs token ids (true)")


def _check_ports(d: Daemon) -> None:
    if d.admin_port and d.admin_port == d.port:  # both sockets would bind (SO_REUSEADDR), one listens
        raise _Invalid("daemon.admin_port", f"equals daemon.port ({d.port}): the API and the admin API need "
                                            "two ports (0: the API port + 1, or a free one)", ("daemon.port",))  # fmt: skip
    if d.port == 65535 and not d.admin_port:
        raise _Invalid("daemon.admin_port", "the admin API listens on daemon.port + 1 by default, and daemon.port "
                                            "is 65535: set daemon.admin_port", ("daemon.port",))  # fmt: skip


def _check_token(d: Daemon) -> None:
    from .auth import token_problem

    if d.admin_token and d.admin_token_file:
        raise _Invalid("daemon.admin_token_file", "set daemon.admin_token or daemon.admin_token_file, not both",
                       ("daemon.admin_token",))  # fmt: skip
    problem = token_problem(d.admin_token) if d.admin_token else None
    if problem:
        raise _Invalid("daemon.admin_token", problem)


def resolved_toml(cfg: DaemonConfig) -> str:
    """The config with every default filled in, as TOML; secrets redacted (daemon/auth.py)."""
    from .auth import redacted

    return _toml(msgspec.to_builtins(redacted(cfg)), [])


def _tables(v: Any) -> bool:
    """An array of tables (`[[groups]]`, `[[faults]]`)."""
    return isinstance(v, list | tuple) and bool(v) and all(isinstance(x, dict) for x in v)


def _toml(table: dict[str, Any], path: list[str], array: bool = False) -> str:
    lines = [f"{k} = {_value(v)}" for k, v in table.items() if not isinstance(v, dict) and not _tables(v)
             and v is not None]  # fmt: skip
    name = ".".join(path)
    out = ([f"[[{name}]]" if array else f"[{name}]"] if path else []) + lines
    text = "\n".join(out) + ("\n" if out else "")
    for k, v in table.items():
        if isinstance(v, dict):
            text += ("\n" if text else "") + _toml(v, [*path, k])
        elif _tables(v):
            for item in v:
                text += ("\n" if text else "") + _toml(item, [*path, k], array=True)
    return text


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return msgspec.json.encode(v).decode()
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)
