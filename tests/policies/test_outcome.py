"""What one upstream outcome counts as, in a table: against the backend (gates and
auto-rollback), and worth a shadow copy. Every status class and error kind at its edge."""

from __future__ import annotations

import pytest

from kvmigrate.policies.outcome import ErrorKind, is_backend_error, worth_a_shadow_copy

CASES = [
    # status, error, the backend's fault, worth a shadow copy
    (200, None, False, True),
    (399, None, False, True),
    (400, None, False, True),  # the client's own fault: still worth comparing
    (404, None, False, True),
    (428, None, False, True),
    (429, None, True, False),  # the backend refusing load; an SDK retries it
    (430, None, False, True),
    (499, None, False, True),
    (500, None, True, False),
    (503, None, True, False),
    (599, None, True, False),
    (None, None, False, False),  # no status and no error: nothing to shadow
    (None, ErrorKind.TIMEOUT, True, False),
    (None, ErrorKind.UNREACHABLE, True, False),
    (200, ErrorKind.STREAM_TIMEOUT, True, False),
    (200, ErrorKind.STREAM_BROKEN, True, False),
    (None, ErrorKind.CLIENT_CANCELLED, True, False),  # a client gave up waiting on it
    (200, ErrorKind.CLIENT_DISCONNECTED, False, True),  # the client left: not the backend
    (None, ErrorKind.CLIENT_DISCONNECTED, False, False),
    (200, ErrorKind.MALFORMED_STREAM, True, False),
    (200, ErrorKind.MALFORMED_BODY, True, False),
    (400, "http_400", False, False),  # an HTTP error kind is judged by its status
    (503, "http_503", True, False),
    (None, "http_400", False, False),
    (None, "APIConnectionError", True, False),  # a LiteLLM exception's name
]


@pytest.mark.parametrize(("status", "error", "backend_fault", "shadowed"), CASES)
def test_outcome_table(
    status: int | None, error: str | None, backend_fault: bool, shadowed: bool
) -> None:
    assert is_backend_error(status, error) is backend_fault
    assert worth_a_shadow_copy(status, error) is shadowed
