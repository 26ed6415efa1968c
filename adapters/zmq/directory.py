"""Where an address lives: address prefixes -> ZeroMQ endpoints.

The cluster manager publishes it; a transport resolves every send through it, so an
entry changed at run time takes effect on the next send. `ipc://` within a host,
`tcp://` across hosts; any other endpoint is refused with a message naming it."""

from __future__ import annotations

from deepserve.core.transport import longest_prefix

# Linux's sun_path holds 108 bytes with the terminating NUL.
IPC_PATH_MAX = 107
MAX_ENTRIES = 65_536


class EndpointError(ValueError):
    """An endpoint that ZeroMQ cannot use, or a scheme deepserve does not route over."""


def check_endpoint(endpoint: str, *, what: str = "endpoint", bind: bool = False) -> str:
    """Return `endpoint` if usable, else raise `EndpointError` naming `what` and the problem."""
    if not isinstance(endpoint, str):
        raise EndpointError(f"{what}: must be a string like 'ipc:///tmp/x' or 'tcp://host:port', "
                            f"got {type(endpoint).__name__}")
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("ipc", "tcp"):
        raise EndpointError(f"{what} {endpoint!r}: scheme must be ipc:// (same host) or tcp:// (across hosts)")
    if scheme == "ipc":
        if not rest:
            raise EndpointError(f"{what} {endpoint!r}: ipc:// needs a path")
        if len(rest.encode()) > IPC_PATH_MAX:
            raise EndpointError(f"{what} {endpoint!r}: ipc path longer than {IPC_PATH_MAX} bytes")
        return endpoint
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise EndpointError(f"{what} {endpoint!r}: tcp:// needs HOST:PORT")
    if port == "*" and bind:
        return endpoint
    if not port.isdigit() or not 0 < int(port) < 65_536:
        raise EndpointError(f"{what} {endpoint!r}: port must be 1..65535" + (" or *" if bind else ""))
    return endpoint


class Directory:
    """Address prefix -> endpoint, longest prefix wins (`te/3/` beats `te/`).

    `version` grows on every change, so a transport's per-address cache knows when
    to forget what it resolved."""

    def __init__(self, routes: dict[str, str] | None = None) -> None:
        self._routes: dict[str, str] = {}
        self.version = 0
        if routes:
            self.update(routes)

    def set(self, prefix: str, endpoint: str) -> None:
        self.update({prefix: endpoint})

    def update(self, routes: dict[str, str]) -> None:
        """Add or change entries; all are checked before any is applied."""
        for prefix, endpoint in routes.items():
            if not isinstance(prefix, str) or not prefix:
                raise EndpointError(f"directory prefix {prefix!r}: must be a non-empty string")
            check_endpoint(endpoint, what=f"directory entry {prefix!r}")
        if len(self._routes.keys() | routes.keys()) > MAX_ENTRIES:
            raise EndpointError(f"directory: more than {MAX_ENTRIES} entries")
        self._routes.update(routes)
        self.version += 1

    def remove(self, prefix: str) -> None:
        if self._routes.pop(prefix, None) is not None:
            self.version += 1

    def resolve(self, addr: str) -> str | None:
        return longest_prefix(self._routes, addr)

    def routes(self) -> dict[str, str]:
        return dict(self._routes)

    # A mapping's face, so `transport.routes["te/"] = endpoint` keeps working (checked).
    def __setitem__(self, prefix: str, endpoint: str) -> None:
        self.set(prefix, endpoint)

    def __getitem__(self, prefix: str) -> str:
        return self._routes[prefix]

    def __delitem__(self, prefix: str) -> None:
        if prefix not in self._routes:
            raise KeyError(prefix)
        self.remove(prefix)

    def __contains__(self, prefix: object) -> bool:
        return prefix in self._routes

    def __len__(self) -> int:
        return len(self._routes)
