"""Context windows of hosted models, to compare with a vLLM's `--max-model-len`.

A conversation longer than the self-hosted engine accepts gets a 400 from vLLM where the
hosted API answered, so the engine's limit should be at least what the hosted model offers
to the traffic being moved. Figures are the providers' published input windows.
"""

from __future__ import annotations

# Longest prefix wins, so "gpt-4o-mini" finds its own row before "gpt-4".
_WINDOWS: dict[str, int] = {
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,
    "gemini-1.5": 1_048_576,
    "gemini-2": 1_048_576,
}


def hosted_context(model: str) -> int | None:
    """The context window of a hosted model name, or None when it is not known here."""
    lowered = model.lower().rsplit("/", 1)[-1]
    matches = [prefix for prefix in _WINDOWS if lowered.startswith(prefix)]
    return _WINDOWS[max(matches, key=len)] if matches else None
