"""ZeroMQ transport between deepserve processes (see transport.py)."""

from .directory import Directory, EndpointError, check_endpoint
from .limits import Limits
from .transport import TransportError, ZmqTransport

__all__ = ["Directory", "EndpointError", "Limits", "TransportError", "ZmqTransport", "check_endpoint"]
