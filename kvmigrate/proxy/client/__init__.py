"""The proxy's upstream HTTP/1.1 client (see `pool`), its answers and its errors."""

from kvmigrate.proxy.client.connection import ChunkSink, Response
from kvmigrate.proxy.client.errors import (
    TIMEOUTS,
    ConnectFailed,
    ConnectTimeout,
    ProtocolViolation,
    ReadTimeout,
    ServerDisconnected,
    UpstreamError,
)
from kvmigrate.proxy.client.head import InvalidHeader
from kvmigrate.proxy.client.pool import HttpClient, SentCall

__all__ = [
    "TIMEOUTS",
    "ChunkSink",
    "ConnectFailed",
    "ConnectTimeout",
    "HttpClient",
    "InvalidHeader",
    "ProtocolViolation",
    "ReadTimeout",
    "Response",
    "SentCall",
    "ServerDisconnected",
    "UpstreamError",
]
