"""Token counts from a usage object, whichever API reported it.

- Chat / completions: `prompt_tokens`, `completion_tokens`, and
  `prompt_tokens_details.cached_tokens`.
- Responses: `input_tokens` (cached ones included), `output_tokens`, and
  `input_tokens_details.cached_tokens`.
- Anthropic Messages: `input_tokens` counts only the tokens after the last cache
  breakpoint; `cache_read_input_tokens` (read from the cache) and
  `cache_creation_input_tokens` (written to it) come on top. The prompt is their sum, the
  cached part is the cache reads, and the cache writes are kept apart: Anthropic bills them
  above plain input.
"""

from __future__ import annotations

from typing import Any

CACHE_READ = "cache_read_input_tokens"
CACHE_WRITE = "cache_creation_input_tokens"


def token_counts(usage: dict[str, Any]) -> dict[str, int]:
    """`prompt`, `completion`, `cached` and (Messages only) `cache_write` tokens; a count
    the usage lacks, or holds as anything but a non-negative integer, is left out."""
    if CACHE_READ in usage or CACHE_WRITE in usage:
        return _messages_counts(usage)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return _valid(
        {
            "prompt": usage.get("prompt_tokens", usage.get("input_tokens")),
            "completion": usage.get("completion_tokens", usage.get("output_tokens")),
            "cached": details.get("cached_tokens") if isinstance(details, dict) else None,
        }
    )


def _messages_counts(usage: dict[str, Any]) -> dict[str, int]:
    read = _count(usage.get(CACHE_READ))
    write = _count(usage.get(CACHE_WRITE))
    plain = _count(usage.get("input_tokens"))
    prompt = None if plain is None else plain + (read or 0) + (write or 0)
    return _valid(
        {
            "prompt": prompt,
            "completion": usage.get("output_tokens"),
            "cached": read,
            "cache_write": write,
        }
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _valid(counts: dict[str, Any]) -> dict[str, int]:
    valid = {k: v for k, v in counts.items() if _count(v) is not None}
    prompt, cached = valid.get("prompt"), valid.get("cached")
    if prompt is not None and cached is not None and cached > prompt:
        # A backend that counts more cached tokens than the prompt had is wrong about one
        # of them: a cache hit above 100% in the report, and savings never made.
        valid["cached"] = prompt
    return valid
