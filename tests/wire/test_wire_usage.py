"""Token counts read from each API's usage object (kvmigrate.wire.usage): what the report's
cache hit rate and savings are computed from."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.wire.usage import token_counts


@pytest.mark.parametrize(
    ("usage", "counts"),
    [
        (
            {"prompt_tokens": 100, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": 64}},
            {"prompt": 100, "completion": 5, "cached": 64},
        ),
        # More cached than the prompt held: one of the two is wrong, and a hit above 100%
        # would claim savings never made. The cached count is capped at the prompt's.
        (
            {"prompt_tokens": 100, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": 4096}},
            {"prompt": 100, "completion": 5, "cached": 100},
        ),
        (
            {"input_tokens": 10, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 11}},
            {"prompt": 10, "completion": 2, "cached": 10},
        ),
        ({"prompt_tokens": -1, "prompt_tokens_details": {"cached_tokens": 3}}, {"cached": 3}),
        (
            {"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": 90,
             "cache_creation_input_tokens": 7},
            {"prompt": 100, "completion": 1, "cached": 90, "cache_write": 7},
        ),
    ],
)  # fmt: skip
def test_token_counts(usage: dict[str, Any], counts: dict[str, int]) -> None:
    assert token_counts(usage) == counts
