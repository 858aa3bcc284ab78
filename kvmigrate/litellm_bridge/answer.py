"""LiteLLM's answers and times in the shapes kvmigrate's recorder reads.

The recorder takes an `Exchange`: JSON (or SSE) bytes of the answer, and perf_counter
times. LiteLLM gives pydantic response objects and wall-clock datetimes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import orjson

from kvmigrate.wire.sse_frames import data_frame

_TOKEN_KEYS = frozenset({"prompt_tokens", "completion_tokens", "input_tokens", "output_tokens"})


def answer_bytes(obj: Any, logged: Mapping[str, Any] | None = None) -> bytes:
    """JSON bytes of a LiteLLM response object (ModelResponse, ResponsesAPIResponse, dict).
    `logged` is LiteLLM's standard logging payload, whose token counts fill in a usage
    object that LiteLLM's logging path left without them (non-streamed Responses answers)."""
    if isinstance(obj, bytes):
        return obj
    dump = getattr(obj, "model_dump", None)
    value = dump() if callable(dump) else obj
    if logged is not None and isinstance(value, dict):
        value = _with_usage(value, logged)
    if isinstance(value, dict) and "error" in value and value["error"] is None:
        # LiteLLM's Responses objects and events carry `"error": null`; the parity reader
        # takes any top-level `error` key for an error envelope, so drop the empty one.
        value = {k: v for k, v in value.items() if k != "error"}
    return orjson.dumps(value, default=str)


def _with_usage(value: dict[str, Any], logged: Mapping[str, Any]) -> dict[str, Any]:
    usage = value.get("usage")
    if not isinstance(usage, dict) or not usage.keys().isdisjoint(_TOKEN_KEYS):
        return value
    prompt, completion = logged.get("prompt_tokens"), logged.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return value
    return {**value, "usage": {**usage, "prompt_tokens": prompt, "completion_tokens": completion}}


def sse_event(obj: Any) -> bytes:
    """One streamed chunk or Responses event as an SSE event, as it came off the wire.
    LiteLLM streams Anthropic's Messages as the wire's bytes, framed already."""
    if isinstance(obj, bytes):
        return obj
    return data_frame(answer_bytes(obj))


def perf_time(
    moment: object, now_wall: float | None = None, now_perf: float | None = None
) -> float | None:
    """A wall-clock moment (datetime or epoch seconds) on the perf_counter clock."""
    if isinstance(moment, datetime):
        wall = moment.timestamp()
    elif isinstance(moment, int | float) and not isinstance(moment, bool):
        wall = float(moment)
    else:
        return None
    now_wall = time.time() if now_wall is None else now_wall
    now_perf = time.perf_counter() if now_perf is None else now_perf
    return now_perf - (now_wall - wall)


def error_status(exc: object) -> int | None:
    """The HTTP status a LiteLLM exception carries, if any."""
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def error_kind(exc: object) -> str:
    status = error_status(exc)
    if status is not None:
        return f"http_{status}"
    return type(exc).__name__ if exc is not None else "error"
