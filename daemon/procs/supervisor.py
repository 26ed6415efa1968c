"""The processes-mode supervisor: the imperative shell that starts, signals and reaps the TE
processes the launcher actor (`launcher.py`) asks for, and reports what it saw back to it as
external inputs. It never restarts anything on its own: a process that exits is reaped and
reported at once (`ProcessExited` → launcher → `PodExited` → cluster manager, which fails the TE,
pushes the membership so the JE stops routing to it, and launches its replacement); heartbeats
remain for a process that hangs without exiting.

Every child runs in its own session (a Ctrl-C in the terminal reaches only the daemon, which
stops the children in order) and dies with its parent (te_host.py). `shutdown` SIGTERMs them
all, waits `grace_s`, SIGKILLs what is left and reaps everything: no orphan survives a stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import structlog

from deepserve.adapters.zmq import Directory
from deepserve.core.messages import Message
from deepserve.persistence.run_dir import log_name

from .messages import (
    ProcessExited,
    ProcessStartFailed,
    ProcessUp,
    ProcessWarm,
    ProcessWarmLost,
    SignalProcess,
    SpawnProcess,
    WarmProcesses,
)
from .routes import drop_endpoint, pod_routes
from .te_host import HostSpec

log = structlog.get_logger("deepserve.procs")
START_TIMEOUT_S = 60.0  # a TE process that has not bound its transport by then failed to start
MAX_CHILDREN = 4096  # a limit on everything
Inject = Callable[[Message], Awaitable[None]]


class Child:
    """One TE process, from spawn to reaping."""

    def __init__(self, pod_id: str, spec: HostSpec) -> None:
        self.pod_id = pod_id
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.endpoint = ""
        self.pending: int | None = None  # a signal asked for before the process existed
        self.task: asyncio.Task[None] | None = None
        self.started = time.monotonic()
        self.reported = False  # its end was reported already (a failed start)
        self.warm_python_s = 0.0  # a claimed pre-warmed process: its own Python start, measured

    def send(self, sig: int) -> None:
        if self.proc is None:
            self.pending = signal.SIGKILL if sig == signal.SIGKILL else (self.pending or sig)
            return
        if self.proc.returncode is None:
            # os.kill, not `send_signal`: Popen.send_signal first polls (waitpid WNOHANG) and so
            # reaps a child that has just exited, stealing it from asyncio's child watcher,
            # which then reports status 255 instead of the real one. A zombie cannot be reused,
            # so signalling it is harmless until the watcher reaps it (and sets `returncode`).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, sig)


class Supervisor:
    def __init__(self, *, run_dir: Path, sock_dir: Path, directory: Directory, inject: Inject,
                 base: dict[str, Any], grace_s: float = 5.0) -> None:  # fmt: skip
        self.run_dir, self.sock_dir = run_dir, sock_dir
        self.directory = directory  # the main process's transport directory
        self.inject = inject  # an external input into the launcher (`pods`)
        self.base = base  # HostSpec fields shared by every child (run id, seed, epoch, endpoints...)
        self.grace_s = grace_s
        self.children: dict[str, Child] = {}
        self.closing = False
        self.spawned = 0
        self._bg: set[asyncio.Task[Any]] = set()
        # pre-warmed TE processes (DeepServe §6.1): pid -> (process, its Python start in seconds)
        self.warm: dict[int, tuple[asyncio.subprocess.Process, float]] = {}

    # ---- from the launcher (called synchronously from the driver's routing) -------------------
    def submit(self, msg: Message) -> None:
        if isinstance(msg, SpawnProcess):
            self._spawn(msg)
        elif isinstance(msg, WarmProcesses):
            for _ in range(min(msg.count, MAX_CHILDREN - len(self.warm))):
                self._later(self._prewarm())
        elif isinstance(msg, SignalProcess):
            child = self.children.get(msg.pod_id)
            if child is not None:
                log.info("signalling TE process", pod=msg.pod_id, kill=msg.kill, reason=msg.reason)
                child.send(signal.SIGKILL if msg.kill else signal.SIGTERM)
                if not msg.kill:
                    self._later(self._kill_after(child, self.grace_s))

    def _spawn(self, msg: SpawnProcess) -> None:
        if self.closing or len(self.children) >= MAX_CHILDREN or msg.pod_id in self.children:
            why = "the daemon is shutting down" if self.closing else "too many TE processes, or a duplicate pod id"
            self._later(self.inject(ProcessStartFailed(pod_id=msg.pod_id, reason=why)))
            return
        name = log_name(msg.pod_id)
        spec = msgspec.convert({
            **self.base, "pod_id": msg.pod_id, "generation": msg.spec.generation,
            "slot": msgspec.to_builtins(msg.spec.slot), "log_path": str(self.run_dir / f"{name}.db"),
            "endpoint": f"ipc://{self.sock_dir}/{name}", "status_path": str(self.sock_dir / f"{name}.json"),
        }, HostSpec)  # fmt: skip
        child = self.children[msg.pod_id] = Child(msg.pod_id, spec)
        warm = self.warm.pop(msg.warm_pid, None) if msg.warm_pid else None
        if warm is not None and warm[0].returncode is None:  # claimed: it did its Python start already
            child.proc, child.warm_python_s = warm
        self.spawned += 1
        child.task = asyncio.get_running_loop().create_task(self._run(child))

    # ---- one child's life -----------------------------------------------------------------------
    async def _run(self, child: Child) -> None:
        try:
            if await self._start(child):
                await self._up(child)
                assert child.proc is not None
                await child.proc.wait()
        except Exception as exc:  # never let a child's task die silently: report and reap
            log.error("TE process supervision failed", pod=child.pod_id, error=repr(exc))
            child.send(signal.SIGKILL)
            if child.proc is not None:
                await child.proc.wait()
        finally:
            await self._reaped(child)

    async def _start(self, child: Child) -> bool:
        proc = child.proc = child.proc or await _te_process()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(msgspec.json.encode(child.spec))
        with contextlib.suppress(OSError):
            await proc.stdin.drain()
        proc.stdin.close()
        if child.pending is not None:
            child.send(child.pending)
        line = b""
        with contextlib.suppress(TimeoutError):
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        word, _, endpoint = line.decode(errors="replace").strip().partition(" ")
        if word == "ready" and endpoint and proc.returncode is None:
            child.endpoint = endpoint
            return True
        child.send(signal.SIGKILL)
        code = await proc.wait()
        why = f"no 'ready' within {START_TIMEOUT_S:g}s" if not line else f"unexpected first line {line[:80]!r}"
        if not line and code is not None:
            why = f"exited with status {code} before it was ready"
        child.reported = True  # `_reaped` says nothing more
        await self.inject(ProcessStartFailed(pod_id=child.pod_id, reason=why))
        return False

    async def _up(self, child: Child) -> None:
        assert child.proc is not None
        self.directory.update(pod_routes(child.spec.slot, child.endpoint))
        log.info("TE process ready", pod=child.pod_id, pid=child.proc.pid, endpoint=child.endpoint,
                 start_s=round(time.monotonic() - child.started, 3))  # fmt: skip
        await self.inject(ProcessUp(pod_id=child.pod_id, pid=child.proc.pid, endpoint=child.endpoint,
                                    log=child.spec.log_path, start_s=time.monotonic() - child.started,
                                    warm_python_s=child.warm_python_s))  # fmt: skip

    # ---- pre-warmed processes -------------------------------------------------------------------
    async def _prewarm(self) -> None:
        """One pre-warmed TE process: started, its Python start-up done (`warm` on its stdout),
        then waiting unassigned for a claim (`SpawnProcess.warm_pid`); an exit before is reported."""
        if self.closing:
            return
        started = time.monotonic()
        proc = await _te_process("--warm")
        assert proc.stdout is not None
        line = b""
        with contextlib.suppress(TimeoutError):
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        if line.strip() != b"warm" or proc.returncode is not None or self.closing:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            why = "the daemon is shutting down" if self.closing else f"not warm: {line[:80]!r}"
            await self.inject(ProcessWarmLost(pid=proc.pid, reason=why))
            return
        python_s = time.monotonic() - started
        self.warm[proc.pid] = (proc, python_s)
        log.info("pre-warmed TE process ready", pid=proc.pid, python_s=round(python_s, 3))
        await self.inject(ProcessWarm(pid=proc.pid, python_s=python_s))
        code = await proc.wait()
        if self.warm.pop(proc.pid, None) is not None and not self.closing:  # it died unclaimed
            await self.inject(ProcessWarmLost(pid=proc.pid, reason=f"exited with status {code} unclaimed"))

    async def _reaped(self, child: Child) -> None:
        self.children.pop(child.pod_id, None)
        if child.endpoint:
            drop_endpoint(self.directory, child.endpoint)
        proc = child.proc
        if child.reported:
            return
        if proc is None:
            await self.inject(ProcessStartFailed(pod_id=child.pod_id, reason="the process could not be started"))
            return
        code = proc.returncode if proc.returncode is not None else await proc.wait()
        log.info("TE process exited", pod=child.pod_id, pid=proc.pid, returncode=code)
        # Reported the moment it is reaped: the manager fails the TE at once (no heartbeat wait)
        await self.inject(ProcessExited(pod_id=child.pod_id, pid=proc.pid, returncode=code, shutdown=self.closing))

    async def _kill_after(self, child: Child, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        if child.proc is not None and child.proc.returncode is None:
            log.warning("TE process ignored SIGTERM; killing it", pod=child.pod_id, pid=child.proc.pid)
            child.send(signal.SIGKILL)

    def _later(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    # ---- the end ----------------------------------------------------------------------------------
    def pids(self) -> dict[str, int]:
        return {p: c.proc.pid for p, c in self.children.items() if c.proc is not None}

    async def shutdown(self, grace_s: float | None = None) -> None:
        """SIGTERM every child, SIGKILL what is left after `grace_s`, reap all (exits reported)."""
        self.closing = True
        grace = self.grace_s if grace_s is None else grace_s
        for proc, _ in list(self.warm.values()):  # nothing of theirs to flush: they never had a TE
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        for child in list(self.children.values()):
            child.send(signal.SIGTERM)
        tasks = [c.task for c in self.children.values() if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            if late:
                for child in list(self.children.values()):
                    child.send(signal.SIGKILL)
                await asyncio.wait(late, timeout=grace)
        for proc, _ in list(self.warm.values()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), grace)
        for task in list(self._bg):
            task.cancel()


async def _te_process(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deepserve.daemon.procs.te_host", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
