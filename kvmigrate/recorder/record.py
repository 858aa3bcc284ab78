"""The plain record of one upstream call, as the recorder stores it."""

from __future__ import annotations

from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One row of the `records` table.

    Times: `ts` is the wall-clock start (Unix seconds); `ttft_ms` and `latency_ms` are
    measured from the upstream call. `error` is the error class: the proxy's transport
    error kind (`connect_error`, `timeout`, `stream_broken`, ...) or `http_<status>` for an
    answer of 400 and above. `tool_calls` holds the called tool names as a JSON array.
    `request_json` and `response_json` hold the (redacted) request body and the assembled,
    non-streamed response, under the `redacted` and `full` content policies only.
    The `parity_*` fields are set on a shadow copy or a noise call, scored against the
    answer it mirrors (kvmigrate.parity.recording).
    """

    request_id: str
    ts: float
    route: str
    backend: str
    role: str
    model: str
    served_model: str
    conversation: str
    turn: int
    stream: bool
    status: int | None = None
    error: str | None = None
    ttft_ms: float | None = None
    latency_ms: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tool_calls: str | None = None
    fallback_from: str | None = None
    pair_id: str | None = None
    source: str = ""
    content: str = "none"
    request_json: str | None = None
    response_json: str | None = None
    parity_kind: str | None = None
    parity_score: float | None = None
    parity_applicable: str | None = None
    parity_disagree: str | None = None
    parity_tool_agree: float | None = None
    parity_json_valid: float | None = None

    def row(self) -> tuple[Any, ...]:
        # attrgetter, not dataclasses.astuple: astuple deep-copies every value.
        return _ROW(self)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Record))
_ROW = attrgetter(*COLUMNS)
