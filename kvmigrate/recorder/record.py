"""The plain record of one upstream call, as the recorder stores it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple


class MessageRow(NamedTuple):
    """One row of the `messages` table (kvmigrate.recorder.history)."""

    digest: str
    last_seen: float
    body: str


# Not frozen: a frozen dataclass sets each of its 35 fields through object.__setattr__,
# which made building a Record, once per record, several times slower.
@dataclass(slots=True)
class Record:
    """One row of the `records` table.

    Times: `ts` is the wall-clock start (Unix seconds); `ttft_ms` and `latency_ms` are
    measured from the upstream call. `error` is the error class: the proxy's transport
    error kind (`connect_error`, `timeout`, `stream_broken`, ...) or `http_<status>` for an
    answer of 400 and above. `tool_calls` holds the called tool names as a JSON array.
    `request_json` and `response_json` hold the (redacted) request body and the assembled,
    non-streamed response, under the `redacted` and `full` content policies only. The
    request's history (chat `messages`, Responses `input`) is stored once per message in
    the `messages` table: `request_messages` lists the digests by key, and `messages` and
    `touched` carry the rows to write with this record (they are not columns).
    `identity` says how the proxy knew the conversation: `header`, `user`, `continuity`,
    `opening` (a first turn), `guess` (a later turn known only by its masked opening), `body`.
    `prompt_tokens` counts every prompt token, cached or not; of them `cached_tokens` were
    read from the prompt cache and `cache_write_tokens` written to it (Anthropic reports
    writes; the other APIs leave it None).
    `decode_ms` is a streamed answer's time from its first byte to its last chunk,
    `decode_chunks` the chunks after the first, and `chunk_gap_max_ms` the longest wait
    between two chunks: with `completion_tokens`, its decode speed (kvmigrate.report.decode).
    `cohort` is the rollout cohort it was routed in (None: recorded before cohorts).
    `response_id` is the id of the answer the client got (a served call only), hashed like
    the conversation id: feedback names an answer by it.
    The `parity_*` fields are set on a shadow copy or a noise call, scored against the
    answer it copies (kvmigrate.parity.recording).
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
    request_messages: str | None = None
    identity: str | None = None
    cache_write_tokens: int | None = None
    cohort: str | None = None
    response_id: str | None = None
    decode_ms: float | None = None
    decode_chunks: int | None = None
    chunk_gap_max_ms: float | None = None
    messages: tuple[MessageRow, ...] = field(default=(), compare=False, repr=False)
    touched: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def row(self) -> tuple[Any, ...]:
        # attrgetter, not dataclasses.astuple: astuple deep-copies every value.
        return _ROW(self)


COLUMNS: tuple[str, ...] = tuple(
    f.name for f in fields(Record) if f.name not in ("messages", "touched")
)
_ROW = attrgetter(*COLUMNS)
