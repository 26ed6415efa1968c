"""`deepserve up`: the runtime, the OpenAI-compatible server and the admin server in one process.

Shutdown (Ctrl-C / SIGTERM): stop accepting (503), let in-flight requests finish for a grace
period, fail what is left with a recorded reason, stop both HTTP servers, flush the log."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import json
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from .admin import create_admin_app
from .auth import check_exposure, daemon_token, redact_processor, redacted
from .config import DaemonConfig
from .fastpath import fast_routes
from .http import create_app
from .metrics import Metrics, cache_info
from .runtime import Runtime

# Where `deepserve status` finds the running daemons: one pointer each (several may run from one
# directory; one pointer for all let a second daemon take over the first's silently, a tour).
POINTERS = Path("runs/daemons")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:  # the daemon handles signals itself
        yield

    def port(self) -> int:
        return int(self.servers[0].sockets[0].getsockname()[1])


class ListenError(Exception):
    """An address the daemon cannot listen on. `key`: the `daemon.*` setting at fault (`host`,
    `port`, `admin_host`, `admin_port`), so the CLI can name the flag that set it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int, admin: bool = False) -> socket.socket:
    """A socket bound at host:port as uvicorn binds one, and listening (uvicorn listens on it
    again, harmlessly), or `ListenError`. Before anything is written: a port in use or a bad host
    leaves no log."""
    prefix = "admin_" if admin else ""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        # Listening now, not when uvicorn starts: two sockets with SO_REUSEADDR may both bind one
        # port until one listens, and the second listen then failed after the log was written.
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        why = (exc.strerror or str(exc)).lower()
        bad_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
        raise ListenError(f"{prefix}{'host' if bad_host else 'port'}", f"cannot listen on {host}:{port}: {why}") from None
    return sock


def bind_listeners(cfg: DaemonConfig) -> tuple[socket.socket, socket.socket]:
    """The API's and the admin API's sockets (`ListenError` for the first that cannot bind)."""
    d = cfg.daemon
    api = bind(d.host, d.port)
    try:
        admin = bind(d.admin_host, admin_port(cfg), admin=True)
    except ListenError:
        api.close()
        raise
    return api, admin


def admin_port(cfg: DaemonConfig) -> int:
    d = cfg.daemon
    return d.admin_port or (d.port + 1 if d.port else 0)


def configure_logging(fmt: str, secrets: tuple[str, ...] = ()) -> None:
    """structlog to stderr; any of `secrets` in a logged value is redacted."""
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(processors=[redact_processor(secrets), structlog.processors.add_log_level,
                                    structlog.processors.TimeStamper(fmt="iso"), renderer],
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))  # fmt: skip


@contextlib.contextmanager
def owner_only() -> Generator[None, None, None]:
    """Files and directories made meanwhile are the user's alone (0600 / 0700): the logs, their
    -wal/-shm files, daemon.json, and — the umask is inherited — the TE processes' logs."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


async def serve(cfg: DaemonConfig, run_dir: Path, grace_s: float = 10.0, ready: Any = None,
                runtime: type[Runtime] = Runtime, sockets: tuple[socket.socket, socket.socket] | None = None,
                token: str | None = None, own_gc: bool = False) -> None:
    """`sockets`: the API's and the admin API's, bound (`bind_listeners`; bound here if None).
    `token`: the admin API's (`auth.daemon_token`; read from the config and environment if None).
    `own_gc`: the process is the daemon's own (`deepserve up`): its cyclic GC is set for serving
    once the cluster is up (`serving_gc`); an embedding program keeps its settings."""
    with owner_only():
        await _serve(cfg, run_dir, grace_s, ready, runtime, sockets, token, own_gc)


# The cyclic GC's first threshold while serving (the CLI's 10,000 before). Measured under `bench
# http`'s load (gc.callbacks, 3,200 requests at concurrency 64 and 16): at 10,000 the collector ran
# 12 young and 1 middle collections, ~310 ms (~0.1 ms a request, 4 % of the daemon's CPU at 64);
# frozen at start-up and at 50,000, 1 young collection, 13 ms.
SERVING_GC_GEN0_THRESHOLD = 50_000


def serving_gc() -> None:
    """Freeze what start-up made (modules, the config, the cluster's first state: never garbage,
    no collection scans it again) and collect young objects less often."""
    gc.freeze()
    gc.set_threshold(SERVING_GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


async def _serve(cfg: DaemonConfig, run_dir: Path, grace_s: float, ready: Any, runtime: type[Runtime],
                 sockets: tuple[socket.socket, socket.socket] | None, token: str | None, own_gc: bool) -> None:  # fmt: skip
    d = cfg.daemon
    log = structlog.get_logger("deepserve.daemon")
    token = daemon_token(cfg) if token is None else token
    check_exposure(cfg, token)
    api_sock, admin_sock = sockets if sockets is not None else bind_listeners(cfg)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    rt = runtime(redacted(cfg, token), run_dir)  # what the runtime logs (its run record) has no secret
    metrics = Metrics(cfg.model_name(), cache_info(cfg), d.max_prompt_tokens + d.max_tokens_limit)
    rt.on_done = metrics.done
    rt.on_pass = metrics.pass_output  # metrics.batch, then metrics.tokens for each chunk
    rt.on_rejected = metrics.rejected
    rt.on_timer_late = metrics.lateness.observe  # Metrics.timer_late without its frame: a call a timer fired
    await rt.start()
    # No access log: at log level "warning" it printed nothing, yet each response still built its
    # line's arguments (the bare server of `bench http` runs with --no-access-log too)
    api = _Server(uvicorn.Config(fast_routes(create_app(rt, metrics)), host=d.host, port=d.port, log_level="warning",
                                 lifespan="off", timeout_graceful_shutdown=2, access_log=False))  # fmt: skip
    admin = _Server(uvicorn.Config(create_admin_app(rt, metrics, token), host=d.admin_host, port=admin_port(cfg),
                                   log_level="warning", lifespan="off", access_log=False))  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(api.serve(sockets=[api_sock]))
        tg.create_task(admin.serve(sockets=[admin_sock]))
        while not (api.started and admin.started):
            if api.should_exit or admin.should_exit:
                raise SystemExit(f"deepserve: error: cannot listen on {d.host}:{d.port} or the admin port")
            await asyncio.sleep(0.01)
        info = {"url": f"http://{d.host}:{api.port()}", "admin_url": f"http://{d.admin_host}:{admin.port()}",
                "run_dir": str(run_dir), "log": str(rt.log_path), "pid": os.getpid()}  # fmt: skip
        _write_atomically(run_dir / "daemon.json", json.dumps(info))
        with contextlib.suppress(OSError):
            POINTERS.mkdir(parents=True, exist_ok=True)
            _write_atomically(pointer_of(os.getpid()), json.dumps(info))
        if own_gc:
            serving_gc()
        tes = sum(rt.groups.values())  # launched at start; the other slots are for scaling up
        log.info("deepserve up", model=cfg.model_name(), tes=tes, spare_slots=len(rt.placement.tes) - tes, **info)
        print(f"deepserve: serving {cfg.model_name()} at {info['url']}/v1  admin {info['admin_url']}  "
              f"log {rt.log_path}", flush=True)  # fmt: skip
        if ready is not None:
            ready(info)
        await stop.wait()
        log.info("deepserve stopping", inflight=len(rt.streams))
        await rt.stop(grace_s)
        api.should_exit = admin.should_exit = True
    _drop_pointer(os.getpid())
    counts = ", ".join(f"{k} {v}" for k, v in rt.counts.items())
    print(f"deepserve: stopped; requests: {counts}; log {rt.log_path}", flush=True)


def _write_atomically(path: Path, text: str) -> None:
    """Whoever waits for the file (a test, `deepserve status`) sees it whole or not at all: a
    plain write let a reader find it empty (a CI run failed 48 tests on it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def pointer_of(pid: int) -> Path:
    return POINTERS / f"{pid}.json"


def _drop_pointer(pid: int) -> None:
    """Remove this daemon's pointer at its clean stop."""
    with contextlib.suppress(OSError):
        pointer_of(pid).unlink()


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("daemon-%Y%m%dT%H%M%SZ", time.gmtime())


def quiet_uvicorn() -> None:
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
