"""What the processes-mode pod launcher (`launcher.py`) exchanges with the outside world.

The launcher is an actor at `pods` in the main process: it decides, the supervisor
(`supervisor.py`, the imperative shell) starts, signals and reaps OS processes. Decisions go out
as messages to `ext/supervisor`; what the supervisor observed comes back as external inputs
(`src="ext/supervisor"`), so a replay of the main log re-runs the launcher on the very process
starts and exits that happened. Inside a TE process, the pod agent (`{te}/pod`) starts the TE's
bootstrap when the launcher says the pod is up, and hands directory changes to its host.
"""

from __future__ import annotations

from deepserve.actors.ports.pod import BootSpec
from deepserve.core.messages import Message

SUPERVISOR = "ext/supervisor"  # the main process's supervisor (outside the actor system)
HOST_DIRECTORY = "ext/directory"  # a process's transport directory (outside the actor system)


class SpawnProcess(Message, frozen=True, kw_only=True):
    """Launcher → supervisor: start a TE process for this pod (its spec is the `BootSpec`)."""

    pod_id: str
    spec: BootSpec


class SignalProcess(Message, frozen=True, kw_only=True):
    """Launcher → supervisor: end a pod's process. `kill`: SIGKILL at once (a fault); else
    SIGTERM (the process flushes its log), then SIGKILL after the supervisor's grace."""

    pod_id: str
    kill: bool
    reason: str


class ProcessUp(Message, frozen=True, kw_only=True):
    """Supervisor → launcher: the pod's process runs and its transport is bound."""

    pod_id: str
    pid: int
    endpoint: str
    log: str  # the process's log file (in the run directory)


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


class BootPod(Message, frozen=True, kw_only=True):
    """Launcher → the pod agent in the new process: start the TE's bootstrap."""

    spec: BootSpec


class PeerRoutes(Message, frozen=True, kw_only=True):
    """The cluster manager's directory as a process applies it to its transport: entries set,
    prefixes removed (`DirectoryUpdate`, relayed by the launcher to every pod agent)."""

    version: int
    routes: dict[str, str]
    removed: tuple[str, ...] = ()
