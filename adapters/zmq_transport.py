"""Kept for imports: the ZeroMQ transport lives in `deepserve.adapters.zmq`."""

from deepserve.adapters.zmq import Directory, EndpointError, Limits, TransportError, ZmqTransport

__all__ = ["Directory", "EndpointError", "Limits", "TransportError", "ZmqTransport"]
