"""`deepserve up | config show | status | fault | scale` (the daemon's command group): the
arguments, their checks and messages, and the admin API's client; the daemon itself is daemon/."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from deepserve.adapters.scenario.loader import ScenarioError
from deepserve.cmdline import CliError, print_json

FAULTS = ("kill-te", "kill-je", "hang-npu", "link-down", "link-up", "link-degrade", "hbm-fault")


def register(sub: Any) -> None:
    up = sub.add_parser("up", help="run the daemon: the cluster, the OpenAI-compatible API, the admin API")
    up.add_argument("--host", help="listen address (default from the config: 127.0.0.1)")
    up.add_argument("--port", type=int, help="HTTP port (0: a free one)")
    up.add_argument("--config", metavar="FILE", help="TOML config (default configs/daemon/default.toml)")
    up.add_argument("--run-dir", metavar="DIR", help="where the log goes (default runs/daemon-<UTC time>)")
    up.add_argument("--log-format", choices=("console", "json"), help="the daemon's own log lines on stderr")
    up.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override one setting by its dotted name, e.g. cluster.tes=4 (repeatable)")
    up.add_argument("--processes", action="store_true",
                    help="one OS process per TE, over ZeroMQ (the control plane, JE, gateway and HTTP stay here)")
    up.set_defaults(func=_up)
    cfg = sub.add_parser("config", help="the daemon's config")
    csub = cfg.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    show = csub.add_parser("show", help="print the resolved config (every default filled in)")
    show.add_argument("--config", metavar="FILE", help="TOML config layered over configs/daemon/default.toml")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override one setting by its dotted name, e.g. cluster.tes=4 (repeatable)")
    show.set_defaults(func=_show)
    st = sub.add_parser("status", help="TEs, roles, DP groups, loads and KV usage of the running daemon")
    _admin_args(st)
    st.add_argument("--json", action="store_true", help="print the admin API's status as JSON")
    st.set_defaults(func=_status)
    ft = sub.add_parser("fault", help="inject a fault into the running daemon (recorded in its log)")
    ft.add_argument("kind", choices=FAULTS,
                    help="link-up repairs a link that link-down or link-degrade broke (up, full bandwidth)")
    ft.add_argument("target", help="a TE (te/0), a JE (je/1), an NPU (hw/s0/npu1) or a link (s0/npu0/roce)")
    ft.add_argument("--bw-factor", type=float, default=None,
                    help="link-degrade: the share of bandwidth left, in (0, 1] (default 0.5)")
    ft.add_argument("--region", default=None, help="hbm-fault: the HBM region, kv or weights (default kv)")
    _admin_args(ft)
    ft.set_defaults(func=_fault)
    sc = sub.add_parser("scale", help="set a TE group's size by hand (launch TEs, or drain and stop)")
    sc.add_argument("group", help="a TE group, model/role (e.g. llama3-8b/colocated; see `deepserve status`)")
    sc.add_argument("size", type=int, help="the group's new size")
    _admin_args(sc)
    sc.set_defaults(func=_scale)


def _admin_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-url", help="the admin API (default: the daemon runs/daemons/ names)")
    p.add_argument("--token-file", metavar="FILE",
                   help="a file holding the bearer token, when the daemon requires one (or set $DEEPSERVE_ADMIN_TOKEN)")
    p.add_argument("--token", default=None, help=argparse.SUPPRESS)  # refused: see _client_token


def _load(args: argparse.Namespace) -> Any:
    from deepserve.daemon.config import load_config

    for entry in args.overrides:
        if _sets_token(entry if isinstance(entry, str) else entry[0]):
            raise CliError("--set daemon.admin_token: a token on the command line is visible to every user "
                           "(ps); set $DEEPSERVE_ADMIN_TOKEN or daemon.admin_token_file instead")  # fmt: skip
    try:
        return load_config(args.config, tuple(args.overrides))
    except ScenarioError as exc:
        raise CliError(str(exc)) from None


def _sets_token(item: str) -> bool:
    """Whether a `--set` puts a token on the command line (`daemon.admin_token=…`, or an inline
    table holding one: `daemon={admin_token=…}`)."""
    from deepserve.adapters.scenario.loader import parse_override

    try:
        key, value = parse_override(item)
    except ScenarioError:
        return False  # load_config names the malformed override
    for part in reversed(key.split(".")):  # the override as the document it sets
        value = {part: value}
    daemon = value.get("daemon")
    return isinstance(daemon, dict) and "admin_token" in daemon


def _up(args: argparse.Namespace) -> int:

    from deepserve.core.asyncdriver import run
    from deepserve.daemon.auth import ENV_VAR, TokenError, check_exposure, daemon_token
    from deepserve.daemon.runtime import Runtime
    from deepserve.daemon.server import (
        ListenError,
        bind_listeners,
        configure_logging,
        default_run_dir,
        serve,
    )

    over: list[Any] = list(args.overrides)
    for key, value in (("host", args.host), ("port", args.port), ("log_format", args.log_format)):
        if value is not None:
            flag = f"--{key.replace('_', '-')} {value}"
            over.append((f"daemon.{key}={json.dumps(value)}", flag))
    args.overrides = over
    cfg = _load(args)
    try:
        token = daemon_token(cfg)
        check_exposure(cfg, token)
    except TokenError as exc:
        raise CliError(str(exc)) from None
    os.environ.pop(ENV_VAR, None)  # read: the TE processes (and anything else started) do not inherit it
    run_dir = Path(args.run_dir or cfg.daemon.run_dir or default_run_dir())
    if (run_dir / "daemon.db").exists():
        raise CliError(f"--run-dir {run_dir} already holds a daemon log; choose a new directory")
    # Checked before anything is written: a failure here leaves no half-made log behind.
    flag = "daemon.run_dir" if cfg.daemon.run_dir and not args.run_dir else "--run-dir"
    _check_run_dir(run_dir, flag)
    try:
        sockets = bind_listeners(cfg)
    except ListenError as exc:
        raise CliError(f"{_listen_flag(args, cfg, exc.key)}: {exc}") from None
    try:  # made here, after the checks: a path the checks pass may still refuse (root under /proc)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # the user's alone
    except OSError as exc:
        for s in sockets:
            s.close()
        raise CliError(f"{flag} {run_dir}: cannot be made: {exc.strerror or exc}") from None
    configure_logging(cfg.daemon.log_format, (token,))
    if args.processes:
        from deepserve.daemon.procs.runtime import ProcRuntime

        run(serve, cfg, run_dir, 10.0, None, ProcRuntime, sockets, token, True)  # (True: own_gc)
    else:
        run(serve, cfg, run_dir, 10.0, None, Runtime, sockets, token, True)
    return 0


def _check_run_dir(run_dir: Path, flag: str) -> None:
    """The run directory can be made (or is a directory) and written: its nearest existing
    ancestor is a writable directory. Nothing is created here."""
    at = run_dir.absolute()
    while not at.exists() and at != at.parent:  # a path under a regular file does not "exist" either
        at = at.parent
    if not at.is_dir():
        where = "is a file" if at == run_dir.absolute() else f"is under {at}, which is not a directory"
        raise CliError(f"{flag} {run_dir}: {where}")
    if not os.access(at, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {run_dir}: {at} is not writable")


def _listen_flag(args: argparse.Namespace, cfg: Any, key: str) -> str:
    """The flag (or config key) that set the address that cannot be listened on."""
    if key == "host" and args.host is not None:
        return f"--host {args.host}"
    if key == "port" and args.port is not None:
        return f"--port {args.port}"
    if key == "admin_port" and not cfg.daemon.admin_port:  # the API port + 1
        via = f"--port {args.port}" if args.port is not None else f"daemon.port {cfg.daemon.port}"
        return f"{via} (the admin API listens on the next port; set daemon.admin_port to move it)"
    return f"daemon.{key} {getattr(cfg.daemon, key)}"


def _show(args: argparse.Namespace) -> int:
    from deepserve.daemon.config import resolved_toml

    print(resolved_toml(_load(args)), end="")
    return 0


def _pointed_url() -> str:
    """The admin URL of the one running daemon started in this directory (`runs/daemons/<pid>.json`,
    written by `deepserve up`, removed at its clean stop); several running: name them."""
    live, gone = _pointed_daemons()
    if len(live) == 1:
        return str(live[0]["admin_url"])
    if live:
        named = "; ".join(f"pid {d['pid']} admin {d['admin_url']} (run dir {d.get('run_dir', '?')})" for d in live)
        raise CliError(f"{len(live)} daemons run from here: {named}: pass --admin-url")
    if gone:
        d = gone[-1]
        raise CliError(f"the daemon runs/daemons/ names (pid {d['pid']}, {d['admin_url']}) is not running: start "
                       "one with `deepserve up`, or pass --admin-url")  # fmt: skip
    raise CliError("no running daemon found here (runs/daemons/ names none): start one with "
                   "`deepserve up`, or pass --admin-url")  # fmt: skip


def _pointed_daemons() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(running, gone) daemons of the pointers in runs/daemons/, each by pid order."""
    live: list[dict[str, Any]] = []
    gone: list[dict[str, Any]] = []
    for path in sorted(Path("runs/daemons").glob("*.json")):
        try:
            info = json.loads(path.read_text())
            str(info["admin_url"]), int(info["pid"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"{path} is unreadable ({exc}); pass --admin-url") from None
        (live if _running(int(info["pid"])) else gone).append(info)
    return live, gone


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it runs, as another user
    return True


def _client_token(args: argparse.Namespace) -> str:
    """The bearer token to send: `--token-file`'s, else `$DEEPSERVE_ADMIN_TOKEN` ("" for none)."""
    from deepserve.daemon.auth import ENV_VAR, TokenError, env_token, read_token_file

    if args.token is not None:
        raise CliError(f"--token: a token on the command line is visible to every user (ps); set ${ENV_VAR} "
                       "or pass --token-file")  # fmt: skip
    try:
        return read_token_file(args.token_file, "--token-file") if args.token_file else env_token(os.environ)
    except TokenError as exc:
        raise CliError(str(exc)) from None


def _admin(args: argparse.Namespace, path: str, body: dict[str, Any] | None = None,
           keys: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """(the URL asked, its answer): a JSON object with every one of `keys`, or one line."""
    url = args.admin_url
    if not url:
        url = _pointed_url()
    else:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise CliError(f"--admin-url: expected http://HOST:PORT, got {url!r}")
    token = _client_token(args)
    where = url.rstrip("/") + path
    req = urllib.request.Request(where, data=None if body is None else json.dumps(body).encode(),
                                 method="GET" if body is None else "POST")  # fmt: skip
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            out = _json_of(where, resp.status, resp.read(MAX_ANSWER_BYTES))
    except urllib.error.HTTPError as exc:
        detail = _error_message(exc.read(MAX_ANSWER_BYTES)) if exc.fp is not None else None
        if detail is None:  # not the admin API's error shape: another server answered
            raise CliError(f"{where} answered HTTP {exc.code} ({exc.reason}), not in the admin API's error "
                           "format: is --admin-url deepserve's admin API?") from None  # fmt: skip
        hint = " (set $DEEPSERVE_ADMIN_TOKEN or pass --token-file)" if exc.code == 401 else ""
        raise CliError(f"admin API {exc.code}: {detail}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach the daemon's admin API at {url}: {getattr(exc, 'reason', exc)}") from None
    except http.client.HTTPException as exc:  # not HTTP at all (an SSH port), or a bad URL port
        raise CliError(f"{where}: no HTTP answer ({type(exc).__name__}: {exc}): is --admin-url deepserve's "
                       "admin API?") from None  # fmt: skip
    missing = [k for k in keys if k not in out]
    if missing:
        raise CliError(f"{where} answered JSON without {', '.join(missing)}: is --admin-url deepserve's admin API?")
    return where, out


MAX_ANSWER_BYTES = 16 << 20  # a status of thousands of TEs fits; a stranger's endless answer does not


def _json_of(where: str, status: int, raw: bytes) -> dict[str, Any]:
    """The admin API's answer: a JSON object, or one line saying another server answered."""
    try:
        out = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        out = None
    if not isinstance(out, dict):
        raise CliError(f"{where} answered HTTP {status} with {'no JSON object' if raw else 'an empty body'}: "
                       "is --admin-url deepserve's admin API?")  # fmt: skip
    return out


def _error_message(raw: bytes) -> str | None:
    """The message of an OpenAI-format error body, or None when the body is not one."""
    try:
        msg = json.loads(raw)["error"]["message"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        return None
    return str(msg)


def _status(args: argparse.Namespace) -> int:
    where, st = _admin(args, "/admin/status", keys=("model", "tes", "requests", "uptime_s"))
    if args.json:
        print_json(st)
        return 0
    try:
        text = format_status(st)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CliError(f"{where} answered a status this client cannot read ({type(exc).__name__}: {exc}): "
                       "is --admin-url deepserve's admin API, of this version?") from None  # fmt: skip
    print(text)
    return 0


def format_status(st: dict[str, Any]) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in st["requests"].items())
    lines = [f"model {st['model']}  up {st['uptime_s']} s  in flight {st['inflight']}  requests: {counts}",
             f"log {st['log']}", ""]  # fmt: skip
    for g, row in st.get("groups", {}).items():
        slots = f"{row['slots']} slot" + ("" if row["slots"] == 1 else "s")
        lines.append(f"group {g}: {row['ready']} ready of target {row['target']} ({slots})")
    for model, pool in st.get("pools", {}).items():  # xLLM §3.2's four instance pools
        lines.append(f"pools {model}: " + "  ".join(f"{k} [{' '.join(v)}]" for k, v in pool.items()))
    if "prewarm" in st:  # DeepServe §6.1: the pod launcher's pools, taken by a scale-out
        w = st["prewarm"]
        execs = " ".join(f"{k} {v}" for k, v in w["executors"].items()) or "-"
        lines.append(f"pre-warmed ({w['policy']}): {w['pods']} pods, {w['masters']} masters, executors {execs}")
    if "autoscale" in st:
        a = st["autoscale"]
        lines.append(f"autoscale {','.join(a['policies'])}{' (advisory)' if a['advisory'] else ''}: "
                     f"{a['decisions']} decisions, {a['scale_outs']} scale-outs, {a['scale_ins']} scale-ins, "
                     f"{a['flips']} flips; last: {a['last'] or '-'}")  # fmt: skip
    procs = f"{'process':<21}" if st.get("mode") == "processes" else ""  # one OS process per TE
    lines.append(f"{'TE':<8}{'role':<11}{'gen':<8}{'state':<10}{procs}{'(last) failure':<62}boot steps")
    for te in st["tes"]:
        steps = " ".join(f"{k} {v:.2f}s" for k, v in te.get("boot_steps", {}).items())
        proc = f"pid {te['pid'] or '-'!s:<8}{te['process']:<9}" if procs else ""
        reason = te.get("reason", "")
        short = reason if len(reason) <= 60 else reason[:59] + "…"  # in full below the table
        lines.append(f"{te['te']:<8}{te['role']:<11}gen {te.get('generation', 1):<3} {te.get('state', '?'):<10}"
                     f"{proc}{short:<62}{steps}")  # fmt: skip
    failures = [f"  {te['te']}: {te['reason']}" for te in st["tes"] if len(te.get("reason", "")) > 60]
    lines += ["", "failures:", *failures] if failures else []
    lines.append("")
    head = f"{'TE':<8}{'role':<11}{'DP':>3}  {'master':<14}{'running':>8}{'waiting':>8}{'KV used':>14}{'KV %':>7}{'prefix hit':>11}"
    lines.append(head)
    for te in st["tes"]:
        for i, dp in enumerate(te["dps"]):
            if not dp.get("alive") or dp.get("device_lost"):
                what = "device lost" if dp.get("alive") else "dead"
                lines.append(f"{te['te']:<8}{te['role']:<11}{i:>3}  {dp['master']:<14}{what:>8}")
                continue
            total = dp["kv_blocks_total"] or 1
            hit = dp["cached_prompt_tokens"] / dp["prompt_tokens"] if dp["prompt_tokens"] else 0.0
            used = f"{dp['kv_blocks_used']}/{dp['kv_blocks_total']}"
            lines.append(f"{te['te']:<8}{te['role']:<11}{i:>3}  {dp['master']:<14}{dp['running']:>8}{dp['waiting']:>8}"
                         f"{used:>14}{100 * dp['kv_blocks_used'] / total:>6.1f}%{100 * hit:>10.1f}%")  # fmt: skip
    return "\n".join(lines)


def _scale(args: argparse.Namespace) -> int:
    if args.size < 0:
        raise CliError(f"size: must be >= 0, got {args.size}")
    _, out = _admin(args, "/admin/scale", {"group": args.group, "size": args.size}, keys=("group", "size", "was"))
    print(f"group {out['group']}: target {out['size']} (was {out['was']})")
    return 0


def _fault(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind, "target": args.target}
    for flag, value, kind in (("--bw-factor", args.bw_factor, "link-degrade"), ("--region", args.region, "hbm-fault")):
        if value is not None and args.kind != kind:
            raise CliError(f"{flag}: only for {kind}, not {args.kind}")
    if args.bw_factor is not None:
        if not 0.0 < args.bw_factor <= 1.0:  # nan fails this too
            raise CliError(f"--bw-factor: must be in (0, 1], got {args.bw_factor}")
        body["bw_factor"] = args.bw_factor
    if args.region is not None:
        body["region"] = args.region
    where, out = _admin(args, "/admin/fault", body, keys=("injected",))
    try:
        lines = [f"injected {row['message']} -> {row['to']}" for row in out["injected"]]
    except (KeyError, TypeError) as exc:
        raise CliError(f"{where} answered an unreadable 'injected' ({type(exc).__name__}: {exc}): "
                       "is --admin-url deepserve's admin API?") from None  # fmt: skip
    for line in lines:
        print(line)
    return 0
