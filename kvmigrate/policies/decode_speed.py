"""Decode speed of one streamed answer, from what the proxy measured while relaying it.

The proxy reads a clock per chunk and nothing more (kvmigrate.exchange); the output token
count comes from the answer's usage. The first token's time is TTFT; what follows it is
decode: `completion_tokens - 1` tokens over the time from the first byte to the last
chunk. One definition, read by the report and by the decode-speed gate alike.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamSpeed:
    """tokens_per_s: output tokens per second after the first; tpot_ms: time per output
    token after the first; gap_mean_ms / gap_max_ms: the mean and the longest wait between
    two relayed chunks (a chunk may carry several tokens, or none)."""

    tokens_per_s: float
    tpot_ms: float
    gap_mean_ms: float
    gap_max_ms: float


def stream_speed(
    completion_tokens: int | None,
    decode_ms: float | None,
    decode_chunks: int | None,
    chunk_gap_max_ms: float | None,
) -> StreamSpeed | None:
    """None where the answer says nothing about decode speed: no usage (a stream asked
    without `stream_options.include_usage`), fewer than two output tokens, or the whole
    answer in one chunk (no time between its first token and its last)."""
    if completion_tokens is None or completion_tokens < 2:
        return None
    if decode_ms is None or decode_ms <= 0 or not decode_chunks:
        return None
    after_first = completion_tokens - 1
    return StreamSpeed(
        tokens_per_s=after_first / (decode_ms / 1000.0),
        tpot_ms=decode_ms / after_first,
        gap_mean_ms=decode_ms / decode_chunks,
        gap_max_ms=chunk_gap_max_ms if chunk_gap_max_ms is not None else 0.0,
    )
