"""A candidate's refusals: a route it does not serve at all (an older vLLM without
/v1/responses, a server without Anthropic's /v1/messages: 404 or 405 for every request on
it, logged once per backend and route), and a request it refuses (any other 4xx but 429:
vLLM's context window smaller than the hosted one, a parameter it does not take). Neither
answers the client's question: in split mode the request falls back to the primary like a
5xx, and in shadow mode the copy counts as the candidate's error. Either way, a refusal the
primary gave as well is the request's, not the candidate's (`blame`)."""

from __future__ import annotations

import logging
from collections.abc import Generator

from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.proxy.exchange import Exchange
from kvmigrate.proxy.stream_check import framing_error, malformed_kind, malformed_kind_sliced
from kvmigrate.wire.errors import read_error

log = logging.getLogger("kvmigrate.proxy")

UNSERVED_STATUSES = frozenset({404, 405})


class UnservedRoutes:
    def __init__(self) -> None:
        self._logged: set[tuple[str, str]] = set()

    def refusal(
        self, backend: str, route: str, status: int | None, body: bytes = b""
    ) -> ErrorKind | None:
        """The error a candidate's 4xx is, if its primary serves the same request: the route
        not served (a 404 or 405 that is no API error: FastAPI's `{"detail": "Not Found"}`,
        logged the first time for this backend and route), or the request refused."""
        if status is None or not is_refusal_status(status):
            return None
        if status in UNSERVED_STATUSES and not names_an_api_error(body):
            self._log_unserved(backend, route, status)
            return ErrorKind.ROUTE_NOT_SERVED
        # An API's own error envelope: the route is there and refused this request (a
        # response id it does not hold, a model it does not serve, a prompt too long).
        return ErrorKind.REJECTED

    def _log_unserved(self, backend: str, route: str, status: int) -> None:
        if (backend, route) in self._logged:
            return
        self._logged.add((backend, route))
        log.warning(
            "candidate %s answers %s on /v1/%s: it does not seem to serve this route "
            "(an older vLLM?); split requests fall back to the primary, shadow copies "
            "count as its errors (kvmigrate_fallbacks_total{reason=%r})",
            backend,
            status,
            route,
            str(ErrorKind.ROUTE_NOT_SERVED),
        )

    def copy_error(
        self, copy: Exchange, event_stream: bool, primary_status: int | None
    ) -> str | None:
        """A candidate's shadow copy judged as split mode judges its answer, so shadow
        evidence counts a candidate that answers garbage, or serves no such route, as
        failing. A 4xx the primary gave as well is the request's, not the candidate's."""
        if framing := framing_error(copy.status, copy.stream, event_stream):
            return framing
        if copy.status == 200:
            return malformed_kind(copy.events_body(), event_stream)
        if blame(ErrorKind.REJECTED, primary_status) is None:
            return None  # asked before `refusal`, which logs a route it thinks not served
        return self.refusal(copy.backend, copy.route, copy.status, copy.body())

    def copy_error_sliced(
        self, copy: Exchange, event_stream: bool, primary_status: int | None
    ) -> Generator[None, None, str | None]:
        """`copy_error`, a long event stream read a slice at a time (kvmigrate.slices)."""
        if copy.status == 200 and not framing_error(copy.status, copy.stream, event_stream):
            return (yield from malformed_kind_sliced(copy.events_body(), event_stream))
        return self.copy_error(copy, event_stream, primary_status)


REFUSALS = frozenset({ErrorKind.ROUTE_NOT_SERVED, ErrorKind.REJECTED})


def is_refusal_status(status: int) -> bool:
    """A 4xx, but 429: that one is the backend's by its status already (its load)."""
    return 400 <= status < 500 and status != 429


def names_an_api_error(body: bytes) -> bool:
    """An API's error answer (OpenAI's or Anthropic's envelope, vLLM's flat or nested one,
    all with a message): the route's own. FastAPI's `{"detail": "Not Found"}` is not one."""
    found = read_error(body) if body else None
    return found is not None and isinstance(found[2], str)


def blame(error: str | None, primary_status: int | None) -> str | None:
    """A candidate's refusal is its error only where the primary answered the same request:
    one the primary refused too (or could not answer) is the request's, not evidence."""
    if error in REFUSALS and (primary_status is None or primary_status >= 400):
        return None
    return error
