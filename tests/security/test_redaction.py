"""Redaction: personal data and secrets scrubbed, structure and ordinary text kept."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmigrate.redaction import (
    _CARD,
    _DIGIT_RUN,
    _MAYBE_SECRET,
    Redactor,
    _maybe_secret_or_digits,
    luhn_ok,
    redact,
    redact_text,
)


@pytest.mark.parametrize(
    ("text", "marker"),
    [
        ("write to john.doe+x@example.co.uk today", "[EMAIL]"),
        ("call +1 415-555-0132", "[PHONE]"),
        ("call (415) 555-0132", "[PHONE]"),
        ("call 415.555.0132", "[PHONE]"),
        ("call +44 20 7946 0958", "[PHONE]"),
        ("pay with 4111 1111 1111 1111", "[CARD]"),
        ("pay with 5500-0000-0000-0004", "[CARD]"),
        ("key sk-proj-abcDEF1234567890abcdef", "[SECRET]"),
        ("Authorization: Bearer abc.def-ghi_jkl12345", "[SECRET]"),
        ("aws AKIAIOSFODNN7EXAMPLE", "[SECRET]"),
        ("token 0123456789abcdef0123456789abcdef", "[SECRET]"),
        ("blob dGhpcyBpcyBhIHNlY3JldCB2YWx1ZSAxMjM0NTY3ODkw==", "[SECRET]"),
        # Issue 21 item 12: IBANs, named secrets, PEM keys, JWTs (unsigned ones too).
        ("wire it to DE89 3704 0044 0532 0130 00 today", "[IBAN]"),
        ("IBAN GB82WEST12345698765432", "[IBAN]"),
        ("password: hunter2", "[SECRET]"),
        ("export DB_PASSWORD=s3cr3t!", "[SECRET]"),
        ('{"client_secret": "abc"}', "[SECRET]"),
        ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg\n-----END PRIVATE KEY-----", "[SECRET]"),
        ("jwt eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0.", "[SECRET]"),
    ],
)
def test_scrubbed(text: str, marker: str) -> None:
    assert marker in redact_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "on 2024-01-15, version 1.2.3, 1234567 items, order 42, pi 3.14159265",
        "ip 192.168.1.1 and between 10-20 items in 2023 and 2024",
        "card-like but not Luhn: 4111 1111 1111 1112",
        "def very_long_identifier_name_without_digits_here(): pass",
        "not an IBAN (check digits fail): DE12 3456 7890 1234 5678",
        "the key to success is hard work; max_tokens: 100",
    ],
)
def test_kept(text: str) -> None:
    assert redact_text(text) == text


def test_luhn() -> None:
    assert luhn_ok("4111111111111111")
    assert not luhn_ok("4111111111111112")


def test_structure_is_kept_and_strings_scrubbed() -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "I am a@b.io"}]},
            {"role": "assistant", "tool_calls": [{"id": "call_1234567890abcdef1234567890", "type": "function",
              "function": {"name": "email", "arguments": '{"to": "a@b.io"}'}}]},
        ],
    }  # fmt: skip
    out = redact(body)
    assert out["model"] == "gpt-4o-mini"
    assert out["messages"][0]["content"][0] == {"type": "text", "text": "I am [EMAIL]"}
    call = out["messages"][1]["tool_calls"][0]
    assert call["id"] == "call_1234567890abcdef1234567890"
    assert call["function"]["name"] == "email"
    assert call["function"]["arguments"] == '{"to": "[EMAIL]"}'
    assert Redactor()(body) == out


# Characters every prefilter and pattern cares about, plus non-ASCII ones (an accented
# letter, an Arabic-Indic digit) that send a string to the regex prefilters instead.
_ALPHABET = string.ascii_letters + string.digits + "+/_-@ \t().:=\n" + "é٤"


@settings(max_examples=2000, deadline=None)
@given(
    st.text(alphabet=_ALPHABET, max_size=60),
    st.sampled_from(
        ["", " bearer x", " BeArEr ", " 415-555-0132", " sk-" + "a1" * 10, " 4111 1111 1111 1111"]
    ),
)
def test_the_bytes_prefilters_agree_with_the_regex_ones(text: str, extra: str) -> None:
    text += extra
    secret, digits, card = _maybe_secret_or_digits(text)
    assert secret == (_MAYBE_SECRET.search(text) is not None)
    assert digits == (_DIGIT_RUN.search(text) is not None)
    if _CARD.search(text):
        assert card  # the card prefilter may pass text without one, never miss one


def test_the_memo_keeps_the_last_strings_across_a_turnover(monkeypatch: pytest.MonkeyPatch) -> None:
    """A string scrubbed just before the memo fills is still known afterwards."""
    calls: list[str] = []
    real = redact_text

    def counting(text: str) -> str:
        calls.append(text)
        return real(text)

    monkeypatch.setattr("kvmigrate.redaction.redact_text", counting)
    redactor = Redactor(capacity=3)
    texts = [f"answer number {n} to mail jo{n}@example.com" for n in range(7)]
    scrubbed = [redactor.text(t) for t in texts]
    assert all("[EMAIL]" in s for s in scrubbed)
    assert [redactor.text(t) for t in texts[3:]] == scrubbed[3:]  # the last 4: remembered
    assert len(calls) == 7
    assert redactor.text(texts[0]) == scrubbed[0]  # long gone: scrubbed again, the same
    assert len(calls) == 8


@pytest.mark.parametrize(
    ("text", "gone"),
    [
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\nxyz\n-----END RSA PRIVATE KEY-----",
            "xyz",
        ),
        ("password: hunter2", "hunter2"),
        ("api_key = 'abc123'", "abc123"),
        ("jwt eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0.sig", "eyJzdWIi"),
    ],
)
def test_a_named_secret_leaves_no_part_behind(text: str, gone: str) -> None:
    scrubbed = redact_text(text)
    assert gone not in scrubbed
    assert "PRIVATE KEY-----" not in scrubbed


def test_a_messages_name_and_the_user_field_are_redacted_a_functions_name_is_not() -> None:
    body = {
        "user": "dave",
        "messages": [{"role": "user", "name": "dave@example.com", "content": "hi there"}],
        "tools": [{"type": "function", "function": {"name": "get_weather_for_city"}}],
    }
    out = Redactor()(body)
    assert out["user"] == "[USER]"
    assert out["messages"][0]["name"] == "[EMAIL]"
    assert out["tools"][0]["function"]["name"] == "get_weather_for_city"
