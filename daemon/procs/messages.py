"""What the processes-mode pod launcher (`launcher.py`) exchanges with the outside world.

The launcher is an actor at `pods` in the main process: it decides, the supervisor
(`supervisor.py`, the imperative shell) starts, signals and reaps OS processes. Decisions go out
as messages to `ext/supervisor`; what the supervisor observed comes back as external inputs
(`src="ext/supervisor"`), so a replay of the main log re-runs the launcher on the very process
starts and exits that happened. Inside a TE process, the pod agent (`{te}/pod`) starts the TE's
bootstrap when the launcher says the pod is up, and hands directory changes to its host.
"""

from __future__ import annotations

from typing import Any

from deepserve.actors.ports.pod import BootSpec
from deepserve.core.messages import Message

SUPERVISOR = "ext/supervisor"  # the main process's supervisor (outside the actor system)
HOST_DIRECTORY = "ext/directory"  # a process's transport directory (outside the actor system)


class SpawnProcess(Message, frozen=True, kw_only=True, omit_defaults=True):
    """Launcher → supervisor: start a TE process for this pod (its spec is the `BootSpec`).
    `warm_pid`: claim that pre-warmed process instead (`WarmProcesses`); a cold start if it is gone."""

    pod_id: str
    spec: BootSpec
    warm_pid: int = 0


class SignalProcess(Message, frozen=True, kw_only=True):
    """Launcher → supervisor: end a pod's process. `kill`: SIGKILL at once (a fault); else
    SIGTERM (the process flushes its log), then SIGKILL after the supervisor's grace."""

    pod_id: str
    kill: bool
    reason: str


class ProcessUp(Message, frozen=True, kw_only=True, omit_defaults=True):
    """Supervisor → launcher: the pod's process runs and its transport is bound. Measured on the
    wall clock: `start_s`, from the spawn (or the claim of a pre-warmed process) to `ready`;
    `warm_python_s`, a claimed pre-warmed process's own Python start (0: a cold process)."""

    pod_id: str
    pid: int
    endpoint: str
    log: str  # the process's log file (in the run directory)
    start_s: float = 0.0
    warm_python_s: float = 0.0


class WarmProcesses(Message, frozen=True, kw_only=True):
    """Launcher → supervisor: start `count` pre-warmed TE processes (DeepServe §6.1): each does
    its Python start-up (imports) and then waits, model-agnostic, for a pod to claim it."""

    count: int


class ProcessWarm(Message, frozen=True, kw_only=True):
    """Supervisor → launcher: a pre-warmed process is ready to be claimed; `python_s`, measured,
    from its spawn to ready (its Python start, off any scale-out's critical path)."""

    pid: int
    python_s: float


class ProcessWarmLost(Message, frozen=True, kw_only=True):
    """Supervisor → launcher: a pre-warmed process exited (or never got ready) unclaimed."""

    pid: int
    reason: str


class ProcessStartFailed(Message, frozen=True, kw_only=True):
    pod_id: str
    reason: str


class ProcessExited(Message, frozen=True, kw_only=True):
    """Supervisor → launcher: the pod's process was reaped (`returncode` < 0: killed by a signal).
    `shutdown`: the supervisor itself stopped it as the daemon shut down (not a crash to replace)."""

    pod_id: str
    pid: int
    returncode: int
    shutdown: bool = False


class BootPod(Message, frozen=True, kw_only=True, omit_defaults=True):
    """Launcher → the pod agent in the new process: start the TE's bootstrap (`scale`: the
    fast-scaling plan, actors/cluster/boot.py's `BootScale` as data; None: no `[scaling]`)."""

    spec: BootSpec
    scale: dict[str, Any] | None = None


class PeerRoutes(Message, frozen=True, kw_only=True):
    """The cluster manager's directory as a process applies it to its transport: entries set,
    prefixes removed (`DirectoryUpdate`, relayed by the launcher to every pod agent)."""

    version: int
    routes: dict[str, str]
    removed: tuple[str, ...] = ()
