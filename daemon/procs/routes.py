"""Which addresses a process's transport sends where (pure; applied by the imperative shells).

The main process routes each TE's addresses (`te/3`, `te/3/...`) and its NPUs to the TE's
process; a TE process routes the main process's address prefixes there, and other TEs (a
decode master pulling KV from a prefill master) by the cluster manager's published directory.
A process never routes its own addresses through its transport: a message to one of its own
actors that has stopped is a dead letter there, not a message bounced between processes.
"""

from __future__ import annotations

from collections.abc import Iterable

from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.zmq import Directory, EndpointError

from .messages import PeerRoutes


def pod_routes(slot: TeSlot, endpoint: str) -> dict[str, str]:
    """The main process's entries for a TE's process: the shell, its children, its NPUs."""
    return {slot.te: endpoint, f"{slot.te}/": endpoint, **{npu: endpoint for npu in slot.npus}}


def main_prefixes(addrs: Iterable[str]) -> tuple[str, ...]:
    """The prefixes that cover the main process's actors (their first path segment)."""
    return tuple(sorted({a.split("/", 1)[0] for a in addrs}))


def drop_endpoint(directory: Directory, endpoint: str) -> list[str]:
    """Remove every entry that points at `endpoint` (its process has exited); the prefixes removed."""
    gone = [p for p, e in directory.routes().items() if e == endpoint]
    for p in gone:
        directory.remove(p)
    return gone


def apply_peer_routes(directory: Directory, msg: PeerRoutes, own_endpoint: str,
                      own_prefixes: tuple[str, ...] = ()) -> str:  # fmt: skip
    """Apply the manager's directory to a process's transport, skipping its own addresses.
    Returns "" or the problem (an endpoint the transport refuses), which the caller logs."""
    def own(prefix: str, endpoint: str = "") -> bool:
        return endpoint == own_endpoint or prefix in own_prefixes

    for prefix in msg.removed:
        if prefix not in msg.routes and prefix in directory and not own(prefix):
            directory.remove(prefix)
    update = {p: e for p, e in msg.routes.items() if not own(p, e)}
    try:
        directory.update(update)
    except EndpointError as exc:
        return str(exc)
    return ""
