"""What the upstream client raises: one base, and a class for each way a call fails.

`proxy.forward.upstream_errors` maps these to the proxy's own failures, in one place."""

from __future__ import annotations


class UpstreamError(Exception):
    """An upstream call failed in transport: no answer, or an answer cut off or unreadable."""


class ConnectFailed(UpstreamError):
    """No connection: nothing listens, the name does not resolve, or TLS failed. Proves the
    replica is down (unlike a dropped keep-alive connection)."""


class ConnectTimeout(ConnectFailed):
    """No connection within the backend's `connect_timeout`."""


class ReadTimeout(UpstreamError):
    """The upstream sent nothing for the backend's `read_timeout`."""


class ServerDisconnected(UpstreamError):
    """The upstream closed the connection before its answer was whole."""

    def __init__(self, message: str, *, before_answer: bool) -> None:
        super().__init__(message)
        # Nothing of an answer arrived: on a reused keep-alive connection the server most
        # likely closed it while idle, and the call can be sent again on a new one.
        self.before_answer = before_answer


class ProtocolViolation(UpstreamError):
    """The upstream's bytes are not an HTTP/1.1 answer we can relay."""


TIMEOUTS = (ConnectTimeout, ReadTimeout)
