"""A candidate's refusals: a route it does not serve at all (an older vLLM without
/v1/responses, a server without Anthropic's /v1/messages: 404 or 405 for every request on
it, logged once per backend and route), and a request it refuses (any other 4xx but 429:
vLLM's context window smaller than the hosted one, a parameter it does not take). Neither
answers the client's question: in split mode the request falls back to the primary like a
5xx, and in shadow mode the copy counts as the candidate's error. Either way, a refusal the
primary gave as well is the request's, not the candidate's (`blame`)."""

from __future__ import annotations

import logging

from kvmigrate.policies.outcome import ErrorKind
from kvmigrate.proxy.exchange import Exchange
from kvmigrate.proxy.stream_check import framing_error, malformed_kind

log = logging.getLogger("kvmigrate.proxy")

UNSERVED_STATUSES = frozenset({404, 405})


class UnservedRoutes:
    def __init__(self) -> None:
        self._logged: set[tuple[str, str]] = set()

    def kind(self, backend: str, route: str, status: int | None) -> ErrorKind | None:
        """The error a candidate's answer on a model route is, if it says the route is not
        served there (logged the first time for this backend and route)."""
        if status not in UNSERVED_STATUSES:
            return None
        if (backend, route) not in self._logged:
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
        return ErrorKind.ROUTE_NOT_SERVED

    def refusal(self, backend: str, route: str, status: int | None) -> ErrorKind | None:
        """The error a candidate's 4xx is, if its primary serves the same request."""
        unserved = self.kind(backend, route, status)
        if unserved is None and status is not None and 400 <= status < 500 and status != 429:
            return ErrorKind.REJECTED  # a 429 is the backend's by its status already
        return unserved

    def copy_error(
        self, copy: Exchange, event_stream: bool, primary_status: int | None
    ) -> str | None:
        """A candidate's shadow copy judged as split mode judges its answer, so shadow
        evidence counts a candidate that answers garbage, or serves no such route, as
        failing. A 4xx the primary gave as well is the request's, not the candidate's."""
        if framing := framing_error(copy.status, copy.stream, event_stream):
            return framing
        if copy.status == 200:
            return malformed_kind(copy.body(), event_stream)
        if blame(ErrorKind.REJECTED, primary_status) is None:
            return None  # asked before `refusal`, which logs a route it thinks not served
        return self.refusal(copy.backend, copy.route, copy.status)


REFUSALS = frozenset({ErrorKind.ROUTE_NOT_SERVED, ErrorKind.REJECTED})


def blame(error: str | None, primary_status: int | None) -> str | None:
    """A candidate's refusal is its error only where the primary answered the same request:
    one the primary refused too (or could not answer) is the request's, not evidence."""
    if error in REFUSALS and (primary_status is None or primary_status >= 400):
        return None
    return error
