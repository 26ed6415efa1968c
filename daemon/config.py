"""The daemon's TOML config: `[daemon]` (where it listens, logs, limits), `[cluster]` (the
scenario schema's `Cluster`, reused: one schema for sims and the daemon), `[pd]`, `[control]` and
`[scheduling]` (the JE's routing policy). Every field validated with an error naming the dotted
key; `resolved()` is what `deepserve config show` prints."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from deepserve.actors.scheduling import DEFAULT_POLICY
from deepserve.adapters.scenario.control import ControlPlane
from deepserve.adapters.scenario.loader import (
    ScenarioError,
    _key_of,
    apply_override,
    parse_override,
    parse_toml,
    source_of,
)
from deepserve.adapters.scenario.sched import Forwarding, Scheduling, check_scheduling
from deepserve.adapters.scenario.schema import Cluster, Scenario, check

MAX_FILE_BYTES = 1 << 20
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]


class Daemon(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: Port = 8000  # 0: a free port (printed at start)
    run_dir: str = ""  # "": runs/daemon-<UTC time>
    log_format: Literal["console", "json"] = "console"
    ingress: str = "gateway"  # the gateway's address: the one actor the frontend sends requests to
    served_model_name: str = ""  # "": the cluster's model name
    tokenizer: str = "approx"  # or a path to a Hugging Face tokenizer.json
    seed: Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)] = 0  # as `sim --seed`: the log's 64-bit column
    admin_host: str = "127.0.0.1"
    admin_port: Port = 0  # 0: a free port (printed at start, and written to the run dir)
    # The admin API's bearer token ("": none; required when admin_host is not loopback). Never on
    # the command line (`ps` shows it to every user): in a config file, in the file
    # `admin_token_file` names, or in $DEEPSERVE_ADMIN_TOKEN (daemon/auth.py).
    admin_token: str = ""
    admin_token_file: str = ""
    max_inflight: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 4096  # then 429
    max_prompt_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 22)] = 32_768
    max_tokens_limit: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 8192
    ttft_deadline_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 60.0  # then 504
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1024, le=1 << 30)] = 4 << 20
    # A request field nobody declared: "error" (a 400 naming it: typos are caught) or "warn"
    # (dropped, one warning per field name, as vLLM does). README, "Request fields".
    unknown_fields: Literal["error", "warn"] = "error"


class PdPool(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """A P/D-disaggregated pool beside the colocated TEs (same model, hardware and scheduler)."""

    prefill_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0  # 0: no P/D pool
    decode_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0
    link: Literal["roce", "hccs", "ub"] = "roce"
    kv_transfer: Literal["contiguous", "block"] = "contiguous"


class DaemonScheduling(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The JE's routing (DeepServe §5): a sim scenario's `[scheduling]` without what the daemon
    fixes itself (one JE; `daemon.max_inflight` bounds what the gateway admits)."""

    policy: Literal["round_robin", "least_load", "locality", "load_aware", "pd_aware", "combined"] = DEFAULT_POLICY  # type: ignore[assignment]
    params: dict[str, int | float] = {}
    heatmap: str = ""  # pd_aware / combined on the mixed group (`deepserve profile heatmap`)
    predictor: str = ""  # a decode-length predictor file ("" = none)
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=16)] = 3
    # a prefill TE whose KV failed to reach its decode TE gets no new task for this long (0: off)
    kv_fail_cooldown_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 5.0
    kv_events: bool = True  # the JE mirrors the TEs' KV cache events (locality sees real caches)
    forwarding: Forwarding = msgspec.field(default_factory=Forwarding)

    def as_scenario_section(self) -> Scheduling:
        return Scheduling(policy=self.policy, params=dict(self.params), heatmap=self.heatmap,
                          predictor=self.predictor, max_attempts=self.max_attempts,
                          kv_fail_cooldown_s=self.kv_fail_cooldown_s, kv_events=self.kv_events,
                          forwarding=self.forwarding)  # fmt: skip


class DaemonConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    daemon: Daemon = msgspec.field(default_factory=Daemon)
    cluster: Cluster = msgspec.field(default_factory=Cluster)
    pd: PdPool = msgspec.field(default_factory=PdPool)
    control: ControlPlane = msgspec.field(default_factory=ControlPlane)  # manager, heartbeats, pods
    scheduling: DaemonScheduling = msgspec.field(default_factory=DaemonScheduling)

    def pd_scenario(self) -> Scenario | None:
        """The P/D pool as a scenario of its own (None when there is none)."""
        p = self.pd
        if not (p.prefill_tes or p.decode_tes):
            return None
        c = msgspec.structs.replace(self.cluster, mode="pd", prefill_tes=max(p.prefill_tes, 1),
                                    decode_tes=max(p.decode_tes, 1), link=p.link, kv_transfer=p.kv_transfer)  # fmt: skip
        return Scenario(name="daemon-pd", seed=self.daemon.seed, cluster=c)

    def scenario(self) -> Scenario:
        return Scenario(name="daemon", seed=self.daemon.seed, cluster=self.cluster)

    def model_name(self) -> str:
        return self.daemon.served_model_name or self.cluster.model


def default_text() -> tuple[str, str]:
    res = resources.files("deepserve") / "configs" / "daemon" / "default.toml"
    return "configs/daemon/default.toml", res.read_text(encoding="utf-8")


def load_config(path: str | None = None, overrides: tuple[str | tuple[str, str], ...] = ()) -> DaemonConfig:
    """The validated config: the default file, with `path`'s tables layered over it (a user's
    file names only what it changes; tables merge key by key, any other value replaces), then the
    overrides. Errors name the key, and the file or override that set it. An override is
    `KEY=VALUE` (`--set`), or `(KEY=VALUE, label)` when a flag set it (`("daemon.port=9",
    "--port 9")`)."""
    default_source, default = default_text()
    doc: dict[str, Any] = parse_toml(default_source, default)
    labels: dict[str, str] = {}  # dotted key -> the file or override that set it
    if path is None:
        source = default_source
    else:
        p = Path(path)
        try:
            if p.stat().st_size > MAX_FILE_BYTES:
                raise ScenarioError(path, "", f"larger than {MAX_FILE_BYTES} bytes")
            source, text = path, p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(path, "", exc.strerror or str(exc)) from None
        except UnicodeDecodeError as exc:
            raise ScenarioError(path, "", f"not UTF-8 text ({exc.reason})") from None
        for key in _layer(doc, parse_toml(source, text)):
            labels[key] = source
    for entry in overrides:
        item, label = (entry, f"--set {entry}") if isinstance(entry, str) else entry
        key, value = parse_override(item)
        apply_override(doc, key, value, label)
        labels[key] = label
    try:
        return _validated(doc)
    except _Invalid as bad:
        # the last file or override that set the key, else one the problem is also about
        origin = next((o for o in (source_of(k, labels, "") for k in (bad.key, *bad.also)) if o), default_source)
        raise ScenarioError(origin, bad.key, bad.problem) from None


def _layer(base: dict[str, Any], top: dict[str, Any], prefix: str = "") -> list[str]:
    """Merge `top` into `base` in place (tables key by key); the dotted keys `top` set."""
    keys: list[str] = []
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            keys += _layer(base[k], v, f"{prefix}{k}.")
        else:
            base[k] = v
            keys.append(prefix + k)
    return keys


class _Invalid(Exception):
    """`also`: other keys the problem is about (the origin named may be where either was set)."""

    def __init__(self, key: str, problem: str, also: tuple[str, ...] = ()) -> None:
        self.key, self.problem, self.also = key, problem, also


def _validated(doc: dict[str, Any]) -> DaemonConfig:
    try:
        cfg = msgspec.convert(doc, DaemonConfig)
    except msgspec.ValidationError as exc:
        raise _Invalid(*_key_of(exc)) from None
    from deepserve.adapters.hardware.models import known_models

    for key, problem in check(cfg.scenario(), known_models()):
        raise _Invalid(key, problem)
    if bool(cfg.pd.prefill_tes) != bool(cfg.pd.decode_tes):
        zero = "pd.prefill_tes" if not cfg.pd.prefill_tes else "pd.decode_tes"  # the one to name
        raise _Invalid(zero, "a P/D pool needs both prefill_tes and decode_tes >= 1 (or both 0: no pool)")
    _check_ports(cfg.daemon)
    _check_token(cfg.daemon)
    if cfg.daemon.tokenizer != "approx":
        from deepserve.adapters.tokenizer import make_tokenizer

        try:
            make_tokenizer(cfg.daemon.tokenizer)  # a missing file or package: refused now, not at start
        except ValueError as exc:
            raise _Invalid("daemon.tokenizer", str(exc).removeprefix("tokenizer: ")) from None
    if cfg.cluster.mode != "colocated":
        raise _Invalid("cluster.mode", "the daemon's [cluster] is the colocated pool; use [pd] for P/D")
    pd = cfg.pd_scenario()
    if pd is not None:
        for key, problem in check(pd, known_models()):
            raise _Invalid(key.replace("cluster.", "pd.", 1), problem)
    if cfg.control.heartbeats and cfg.cluster.scheduler.aggregate:
        # an aggregated decode run is one long NPU request: its master would look stalled
        raise _Invalid("cluster.scheduler.aggregate", "must be false while control.heartbeats is on")
    if not cfg.cluster.scheduler.stream_token_ids:
        raise _Invalid("cluster.scheduler.stream_token_ids", "the daemon needs token ids (true)")
    section = msgspec.structs.replace(cfg.scenario(), scheduling=cfg.scheduling.as_scenario_section())
    for key, problem in check_scheduling(section):
        raise _Invalid(key, problem)
    return cfg


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


def _toml(table: dict[str, Any], path: list[str]) -> str:
    lines = [f"{k} = {_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    out = ([f"[{'.'.join(path)}]"] if path else []) + lines
    text = "\n".join(out) + ("\n" if out else "")
    for k, v in table.items():
        if isinstance(v, dict):
            text += ("\n" if text else "") + _toml(v, [*path, k])
    return text


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return msgspec.json.encode(v).decode()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return repr(v)
