"""Redaction at the edges of each rule: the lengths where a phone number, an IBAN or a card
starts and stops counting, the shortest value that is scrubbed, and which JSON fields are
structure, personal, or text. Each row pins one boundary a mutant moved (docs/mutation.md)."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.redaction import (
    CARD,
    EMAIL,
    IBAN,
    PHONE,
    SECRET,
    USER,
    Redactor,
    redact,
    redact_text,
)


def iban(country: str, bban: str) -> str:
    """A syntactically valid IBAN: check digits computed as ISO 13616 says (98 - mod 97)."""
    digits = "".join(str(int(c, 36)) for c in bban + country + "00")
    return f"{country}{98 - int(digits) % 97:02d}{bban}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Bare digits: a phone number only from 10 to 15 digits (E.164's maximum).
        ("call 123456789 now", "call 123456789 now"),
        ("call 1234567890 now", f"call {PHONE} now"),
        ("call 123456789012345 now", f"call {PHONE} now"),
        ("call 1234567890123456 now", "call 1234567890123456 now"),
        # Formatted: from 7 to 15 digits.
        ("call 55-01-32 now", "call 55-01-32 now"),
        ("call 555-0132 now", f"call {PHONE} now"),
        ("call +44 20 7946 0958 123 now", f"call {PHONE} now"),
        ("call +44 20 7946 0958 1234 now", "call +44 20 7946 0958 1234 now"),
    ],
)
def test_phone_number_lengths(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Markdown emphasis with underscores: `\b` saw no word edge inside `_..._`.
        ("mail _jane.doe@example.com_ today", f"mail {EMAIL}_ today"),
        ("call _555-123-4567_ now", f"call _{PHONE}_ now"),
        ("call __555-123-4567__ now", f"call __{PHONE}__ now"),
        ("key __sk-abcdefabcdefabcdefabcdef__ here", f"key __{SECRET}__ here"),
        ("id __AKIAABCDEFGHIJKLMNOP__", f"id __{SECRET}__"),
        ("my _password=hunter2 ok", f"my _password={SECRET} ok"),
        (f"to _{iban('NO', '86011117947')}_", f"to _{IBAN}_"),
        # Digits that end or start an identifier are not a phone number.
        ("id_5551234567 stays", "id_5551234567 stays"),
        ("x 555-123-4567_abc stays", "x 555-123-4567_abc stays"),
    ],
)
def test_underscores_around_a_value_do_not_hide_it(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("value", "redacted"),
    [
        (iban("NO", "86011117947"), True),  # 15 characters: the shortest (Norway)
        (iban("LC", "HEMM000100010012001200023015"), True),  # 32
        (iban("XK", "1234567890123456789012345678AB"), True),  # 34: the longest allowed
        (iban("NO", "86011117947")[:-1] + "0", False),  # the check digits no longer hold
    ],
)
def test_iban_lengths(value: str, redacted: bool) -> None:
    assert redact_text(f"pay to {value} today") == (
        f"pay to {IBAN} today" if redacted else f"pay to {value} today"
    )


@pytest.mark.parametrize(
    ("number", "redacted"),
    [("4222222222222", True), ("4111111111111111", True), ("4222222222223", False)],
)
def test_card_numbers_from_13_digits(number: str, redacted: bool) -> None:
    """13 digits is the shortest card (old Visa); the Luhn check decides."""
    assert (CARD in redact_text(f"card {number} ok")) is redacted


def test_the_shortest_scrubbed_value_is_six_characters() -> None:
    assert redact_text("a@b.co") == EMAIL
    assert redact({"content": "a@b.co"}) == {"content": EMAIL}
    assert Redactor()("a@b.co") == EMAIL


def test_an_assignment_is_found_among_every_keyword() -> None:
    text = "token=abc12345 key pwd secret password=hunter22"
    assert redact_text(text) == f"token={SECRET} key pwd secret password={SECRET}"


def test_a_lone_surrogate_does_not_stop_redaction() -> None:
    """JSON can carry `\\udcff`; the named-secret scan encodes with surrogateescape."""
    assert redact_text("password: hunter22 \udcff") == f"password: {SECRET} \udcff"


@pytest.mark.parametrize(
    ("value", "key", "expected"),
    [
        ("jdoe-customer-42", "user", USER),  # personal, whatever it looks like
        ("jdoe-customer-42", "safety_identifier", USER),
        (["jdoe-customer-42", "other-customer"], "user", [USER, USER]),
        ({"user": ["jdoe-customer-42"]}, None, {"user": [USER]}),
        ({"user": "jdoe-customer-42"}, None, {"user": USER}),
        ({"metadata": {"user_id": "jdoe-customer-42"}}, None, {"metadata": {"user_id": USER}}),
        ("a@b.co", "id", "a@b.co"),  # structural: kept verbatim
        ("a@b.co", "model", "a@b.co"),
        ("a@b.co", "content", EMAIL),
        (["a@b.co"], "content", [EMAIL]),
        ("a@b.co", None, EMAIL),
        ({"n": 5, "b": True, "f": 1.5, "z": None}, None, {"n": 5, "b": True, "f": 1.5, "z": None}),
        ({"meta": {"note": "mail a@b.co"}}, None, {"meta": {"note": f"mail {EMAIL}"}}),
        (7, "user", 7),
    ],
)
def test_fields_by_key(value: Any, key: str | None, expected: Any) -> None:
    assert redact(value, key) == expected
    assert Redactor()(value, key) == expected
