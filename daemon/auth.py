"""The admin API's bearer token: where it comes from, where it must never appear.

The token is read from a config file's `daemon.admin_token`, from the file `daemon.admin_token_file`
names, or from `$DEEPSERVE_ADMIN_TOKEN` — never from the command line, where `ps` shows it to every
user. It is compared in constant time, and redacted wherever the config is written or shown (the
log's run record, `deepserve config show`, the daemon's structlog output). The run record keeps
whether a token was required (`"<redacted>"`) but not the token: the run digest covers the logged
config, so it never depends on the secret (a published digest could otherwise be used to guess
a weak token offline), and replay does not read the token at all.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from .config import DaemonConfig

ENV_VAR = "DEEPSERVE_ADMIN_TOKEN"
REDACTED = "<redacted>"
MAX_TOKEN_BYTES = 4096
# RFC 6750's b64token: what an `Authorization: Bearer` header can carry as is.
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


class TokenError(Exception):
    """A token that cannot be used, naming where it came from (one line)."""


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a bearer token, or None."""
    if len(token) > MAX_TOKEN_BYTES:
        return f"longer than {MAX_TOKEN_BYTES} characters"
    if not _TOKEN.fullmatch(token):
        return "must be letters, digits and - . _ ~ + / (then = padding): what a Bearer header carries"
    return None


def read_token_file(path: str, label: str) -> str:
    """The token in the file at `path` (surrounding whitespace, such as the final newline, removed)."""
    try:
        p = Path(path)
        if p.stat().st_size > MAX_TOKEN_BYTES + 64:
            raise TokenError(f"{label} {path}: larger than a token ({MAX_TOKEN_BYTES} characters)")
        token = p.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise TokenError(f"{label} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TokenError(f"{label} {path}: not UTF-8 text") from None
    if not token:
        raise TokenError(f"{label} {path}: the file is empty")
    problem = token_problem(token)
    if problem:
        raise TokenError(f"{label} {path}: {problem}")
    return token


def env_token(environ: Mapping[str, str]) -> str:
    token = environ.get(ENV_VAR, "").strip()
    problem = token_problem(token) if token else None
    if problem:
        raise TokenError(f"${ENV_VAR}: {problem}")
    return token


def daemon_token(cfg: DaemonConfig, environ: Mapping[str, str] = os.environ) -> str:
    """The token the admin API requires ("" for none): the config's (`admin_token`, or the file
    `admin_token_file` names) or `$DEEPSERVE_ADMIN_TOKEN`; both set and different is refused."""
    d = cfg.daemon
    from_cfg, where = d.admin_token, "daemon.admin_token"
    if d.admin_token_file:
        from_cfg, where = read_token_file(d.admin_token_file, "daemon.admin_token_file"), "daemon.admin_token_file"
    from_env = env_token(environ)
    if from_cfg and from_env and not hmac.compare_digest(from_cfg.encode(), from_env.encode()):
        raise TokenError(f"${ENV_VAR} and {where} hold different tokens: unset one")
    return from_cfg or from_env


def check_exposure(cfg: DaemonConfig, token: str) -> None:
    """An admin API listening beyond loopback must require a token."""
    host = cfg.daemon.admin_host
    if not token and not is_loopback(host):
        raise TokenError(f"daemon.admin_host {host or '(all interfaces)'} is not a loopback address and "
                         f"daemon.admin_token is not set: the admin API (faults, scaling) would be open to the "
                         f"network; set a token (${ENV_VAR} or daemon.admin_token_file) or "
                         f"daemon.admin_host=127.0.0.1")  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name (or ""): it may resolve to anything
        return False


def bearer_ok(header: str, token: str) -> bool:
    """The request's `Authorization` header carries `token` (constant time: a byte-by-byte
    comparison would tell an attacker how much of a guess was right)."""
    return hmac.compare_digest(header.encode("latin-1", "replace"), f"Bearer {token}".encode())


def redacted(cfg: DaemonConfig, token: str = "") -> DaemonConfig:
    """`cfg` as it may be written or shown: `admin_token` is `"<redacted>"` when the admin API
    requires a token (`token`, or one in the config), "" when it does not."""
    required = bool(token or cfg.daemon.admin_token)
    d = msgspec.structs.replace(cfg.daemon, admin_token=REDACTED if required else "")
    return msgspec.structs.replace(cfg, daemon=d)


def redact_processor(secrets: tuple[str, ...]) -> Any:
    """A structlog processor that replaces each secret in any logged string by `<redacted>`."""
    secrets = tuple(s for s in secrets if s)

    def redact(_logger: Any, _name: str, event: dict[str, Any]) -> dict[str, Any]:
        if not secrets:
            return event
        for key, value in event.items():
            text = value if isinstance(value, str) else None
            if text is None and isinstance(value, (dict, list, tuple)):
                text = repr(value)  # a structure holding the secret is logged as its text
            if text is not None and any(s in text for s in secrets):
                for s in secrets:
                    text = text.replace(s, REDACTED)
                event[key] = text
        return event

    return redact
