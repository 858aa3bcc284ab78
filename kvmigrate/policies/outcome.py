"""What one upstream call's outcome says: against the backend, and worth a shadow copy?

One definition serves the recorded windows (gates, reports) and the live auto-rollback
window alike, so the two can never disagree on what counts as the backend's failure.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """Why an upstream call failed, as `Exchange.error` holds it; an HTTP error status is
    `http_<status>`, and an error of the LiteLLM library its exception's name. A StrEnum:
    records, metrics labels and JSON hold the same strings as before."""

    TIMEOUT = "timeout"  # no answer in time
    UNREACHABLE = "unreachable"  # no connection
    STREAM_TIMEOUT = "stream_timeout"  # the answer stalled after it began
    STREAM_BROKEN = "stream_broken"  # the connection broke after the answer began
    # The client left after the answer had started: nothing the backend did wrong.
    CLIENT_DISCONNECTED = "client_disconnected"
    # The client gave up before the first byte: a slow backend is exactly what this
    # catches, so it counts against the backend that kept it waiting.
    CLIENT_CANCELLED = "client_cancelled"
    MALFORMED_STREAM = "malformed_stream"  # a candidate's event that does not parse
    MALFORMED_BODY = "malformed_body"  # a candidate's body that does not parse
    # A candidate's 404/405 on a model route: it does not serve the route (proxy.unserved).
    ROUTE_NOT_SERVED = "route_not_served"
    # A candidate's answer with a status no model route answers with (1xx, 3xx, a 2xx
    # other than 200): a redirect or an empty answer is not an answer, whatever it says.
    UNEXPECTED_STATUS = "unexpected_status"
    # A candidate's 4xx to a request its primary answered: the request was fine (vLLM's
    # context window smaller than the hosted one, a parameter it does not take), so the
    # refusal counts against the candidate. Only a shadow copy, beside its primary's
    # answer, can tell this from a client's bad request.
    REJECTED = "rejected"
    # The proxy stopped and its drain ended before the answer did: cut by us, not the backend.
    PROXY_SHUTDOWN = "proxy_shutdown"


NOT_BACKEND_ERRORS = frozenset({ErrorKind.CLIENT_DISCONNECTED, ErrorKind.PROXY_SHUTDOWN})


def is_backend_error(status: int | None, error: str | None) -> bool:
    """Transport errors, 5xx and 429 answers (a backend refusing load), and clients that
    gave up waiting; any other 4xx is the client's fault."""
    if status is not None and (status >= 500 or status == 429):
        return True
    return error is not None and not error.startswith("http_") and error not in NOT_BACKEND_ERRORS


def worth_a_shadow_copy(status: int | None, error: str | None) -> bool:
    """Whether the primary's outcome earns the candidate a shadow copy. A failure an SDK
    retries (a transport error, a 429 or a 5xx) does not: the retry brings its own copy,
    and shadowing every attempt multiplied the candidate's load and skewed the evidence."""
    if error is not None and error not in NOT_BACKEND_ERRORS:
        return False
    return status is not None and status != 429 and status < 500


def refused_client(status: int | None) -> bool:
    """The primary refused the client itself (its key, or what the key may do): nothing a
    candidate should be shown, whatever `shadow_primary_failures` says."""
    return status in (401, 403)


def latency_counts(status: int | None, error: str | None) -> bool:
    """An answer, not a failure: only an answer's times say how fast a backend answers (a
    503 in 1 ms would flatter its latency, in the report and in the TTFT gate's latency)."""
    return ttft_counts(status) and error is None


def ttft_counts(status: int | None) -> bool:
    """Whether an answer's first byte is a first token: not an error status's."""
    return status is not None and status < 400
