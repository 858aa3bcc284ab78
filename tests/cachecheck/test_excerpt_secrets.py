"""A break's excerpt never shows a secret known only by its name, even when the window
starts inside the value, past the name."""

from __future__ import annotations

import pytest

from kvmigrate.cachecheck.excerpt import window

PROMPT = 'You are a helper. session_token: "correct horse battery staple" Answer briefly.'


@pytest.mark.parametrize("word", ["correct", "horse", "battery", "staple"])
def test_a_window_around_a_named_secret_shows_none_of_it(word: str) -> None:
    offset = PROMPT.index(word)
    for width in (4, 12, 32):
        excerpt = window(PROMPT, offset, width)
        for secret_word in ("correct", "horse", "battery", "staple"):
            assert secret_word not in excerpt, (width, excerpt)


def test_a_window_keeps_the_name_and_the_text_around() -> None:
    excerpt = window(PROMPT, PROMPT.index("horse"), 40)
    assert 'session_token: "[SECRET]"' in excerpt
    assert "Answer" in excerpt


def test_a_window_on_a_secret_named_on_an_earlier_line_of_json() -> None:
    text = '{"api_key": "alpha bravo charlie delta echo foxtrot golf hotel"}\nnext line'
    excerpt = window(text, text.index("golf"), 6)
    assert "golf" not in excerpt
    assert "foxtrot" not in excerpt
    assert "hotel" not in excerpt
