"""The slice of the records table the report aggregates, fetched once per report."""

from __future__ import annotations

from typing import NamedTuple

from kvmigrate.recorder.queries import MODEL_TRAFFIC, record_cohort
from kvmigrate.recorder.store import RecordStore

PARITY_COLUMNS = (
    "parity_score",
    "parity_tool_agree",
    "parity_json_valid",
    "parity_kind",
    "parity_applicable",
    "parity_disagree",
)

DECODE_COLUMNS = ("decode_ms", "decode_chunks", "chunk_gap_max_ms")


class Row(NamedTuple):
    request_id: str
    ts: float
    backend: str
    role: str
    conversation: str
    turn: int
    status: int | None
    error: str | None
    ttft_ms: float | None
    latency_ms: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    pair_id: str | None
    parity_score: float | None
    parity_tool_agree: float | None
    parity_json_valid: float | None
    parity_kind: str | None
    parity_applicable: str | None
    parity_disagree: str | None
    identity: str | None = None
    fallback_from: str | None = None
    cache_write_tokens: int | None = None  # of prompt_tokens, written to the prompt cache
    cohort: str = ""  # queries.record_cohort: the model's own for a record from before cohorts
    decode_ms: float | None = None  # a stream's first byte to its last chunk (m010)
    decode_chunks: int | None = None
    chunk_gap_max_ms: float | None = None


def fetch_rows(store: RecordStore, since: float, until: float) -> tuple[list[Row], bool]:
    """The model-traffic rows that started in [since, until), and whether the parity engine's
    columns exist (absent columns read as NULL, so one query serves both schemas)."""
    present = store.columns("records")
    has_parity = "parity_score" in present
    parity = ", ".join(c if c in present else "NULL" for c in PARITY_COLUMNS)
    identity = "identity" if "identity" in present else "NULL"
    writes = "cache_write_tokens" if "cache_write_tokens" in present else "NULL"
    cohort = record_cohort(present)
    decode = ", ".join(c if c in present else "NULL" for c in DECODE_COLUMNS)
    sql = (
        "SELECT request_id, ts, backend, role, conversation, turn, status, error, ttft_ms, "
        "latency_ms, prompt_tokens, cached_tokens, completion_tokens, pair_id, "
        f"{parity}, {identity}, fallback_from, {writes}, {cohort}, {decode} FROM records "
        f"WHERE ts >= ? AND ts < ? AND {MODEL_TRAFFIC} ORDER BY ts"
    )
    return [Row(*r) for r in store.query(sql, (since, until))], has_parity
