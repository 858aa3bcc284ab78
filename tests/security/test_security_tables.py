"""Every redaction rule in `kvmigrate/redaction.py`, each with a value only that rule
catches and a near miss it must leave alone. Outputs are compared exactly, so a rule that
goes missing fails its row even where another rule would garble the same text."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.redaction import redact

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.sig_abc-123"
# A body under 32 characters: the long-base64 rule must not be what catches it.
PEM = "-----BEGIN {kind}-----\nMIIBIjANBgkqhkiG\n-----END {kind}-----"

CAUGHT = [
    # vendor keys: sk-/rk-/pk_ with their optional dashed middle parts
    ("openai key", "key sk-proj-abcdefghijklmnop1234 here", "key [SECRET] here"),
    ("restricted key", "rk-abcdefghijklmnop1234", "[SECRET]"),
    ("stripe key", "pk_live_abcdefghijklmnop1234", "[SECRET]"),
    ("bearer", "Bearer abcdefgh.123", "[SECRET]"),
    ("aws key id", "AKIAABCDEFGHIJKLMNOP", "[SECRET]"),
    ("aws session key id", "ASIAABCDEFGHIJKLMNOP", "[SECRET]"),
    ("github ghp", "ghp_abcdefghij1234567890", "[SECRET]"),
    ("github gho", "gho_abcdefghij1234567890", "[SECRET]"),
    ("github ghs", "ghs_abcdefghij1234567890", "[SECRET]"),
    ("github ghu", "ghu_abcdefghij1234567890", "[SECRET]"),
    ("github fine-grained", "github_pat_abcdefghij12345", "[SECRET]"),
    ("slack xoxa", "xoxa-1234567890-abcdefgh", "[SECRET]"),
    ("slack xoxb", "xoxb-1234567890-abcdefgh", "[SECRET]"),
    ("slack xoxp", "xoxp-1234567890-abcdefgh", "[SECRET]"),
    ("slack xoxr", "xoxr-1234567890-abcdefgh", "[SECRET]"),
    ("slack xoxs", "xoxs-1234567890-abcdefgh", "[SECRET]"),
    ("gitlab", "token glpat-abcdefghij123 ok", "token [SECRET] ok"),
    ("jwt", f"jwt {JWT} end", "jwt [SECRET] end"),
    ("unsigned jwt", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxIn0.", "[SECRET]"),
    ("hex secret", "deadbeef" * 4, "[SECRET]"),
    ("base64 secret", "AbCdEfGhIjKlMnOpQrStUvWxYz1234567890", "[SECRET]"),
    ("email", "write to jane.doe@example.com today", "write to [EMAIL] today"),
    ("phone", "call +1 415 555 0132 now", "call [PHONE] now"),
    ("dotted phone", "415.555.0132", "[PHONE]"),
    ("bare national number", "4155550132", "[PHONE]"),
    ("card", "card 4111 1111 1111 1111 ok", "card [CARD] ok"),
    ("card with dashes", "4111-1111-1111-1111", "[CARD]"),
    ("iban grouped", "GB82 WEST 1234 5698 7654 32", "[IBAN]"),
    ("iban plain", "DE89370400440532013000", "[IBAN]"),
    ("rsa private key", PEM.format(kind="RSA PRIVATE KEY"), "[SECRET]"),
    ("private key", PEM.format(kind="PRIVATE KEY"), "[SECRET]"),
    ("openssh private key", PEM.format(kind="OPENSSH PRIVATE KEY"), "[SECRET]"),
    ("truncated private key", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE", "[SECRET]"),
    ("password", "password: hunter2", "password: [SECRET]"),
    ("passwd", "passwd=hunter2", "passwd=[SECRET]"),
    ("passphrase", "passphrase := hunter2", "passphrase := [SECRET]"),
    ("pwd", "db_pwd => hunter2", "db_pwd => [SECRET]"),
    ("secret", "client_secret='abc'", "client_secret='[SECRET]'"),
    ("api key", '"api_key": "abc1"', '"api_key": "[SECRET]"'),
    ("apikey", "APIKEY=abc1", "APIKEY=[SECRET]"),
    ("token", "token: abc1", "token: [SECRET]"),
]

LEFT_ALONE = [
    ("short sk", "sk-short"),
    ("sk inside a word", "task-abcdefghijklmnopqrst"),
    ("bearer of news", "the bearer of bad news"),
    ("aws id one short", "AKIAABCDEFGHIJKLMNO"),
    ("unknown github prefix", "ghx_abcdefghij1234567890"),
    ("unknown slack prefix", "xoxz-1234567890-abcdefgh"),
    ("short gitlab", "glpat-abc"),
    ("jwt header alone", "eyJhbGciOiJIUzI1NiJ9"),
    ("jwt too short", "eyJhbGciOi.e30."),
    ("hex one short", "deadbeef" * 3 + "deadbee"),
    ("long identifier", "averyveryverylongidentifiernamewithoutdigits"),
    ("no tld", "user@localhost"),
    ("version", "version 1.2.3.4"),
    ("date", "on 2024-01-02"),
    ("short number", "order 123456"),
    ("card failing luhn", "4111 1111 1111 1112"),
    ("iban failing mod-97", "DE89370400440532013001"),
    ("public key", PEM.format(kind="PUBLIC KEY")),
    ("certificate", PEM.format(kind="CERTIFICATE")),
    ("password as a word", "passwords are long"),
    ("secret as a word", "the secret is out"),
    ("keyword without a value", "token:"),
]


def through_a_message(text: str) -> Any:
    """The public path: a chat message as the recorder hands it over."""
    return redact({"role": "user", "content": text})["content"]


@pytest.mark.parametrize(("rule", "text", "expected"), CAUGHT, ids=[c[0] for c in CAUGHT])
def test_each_rule_catches_its_shape(rule: str, text: str, expected: str) -> None:
    assert through_a_message(text) == expected


@pytest.mark.parametrize(("rule", "text"), LEFT_ALONE, ids=[c[0] for c in LEFT_ALONE])
def test_each_rule_leaves_its_near_miss_alone(rule: str, text: str) -> None:
    assert through_a_message(text) == text


@pytest.mark.parametrize("key", ["user", "safety_identifier", "user_id"])
def test_end_user_ids_are_replaced_whatever_they_look_like(key: str) -> None:
    assert redact({"model": "m", key: "u1"})[key] == "[USER]"


@pytest.mark.parametrize(
    "key",
    ["role", "type", "model", "id", "tool_call_id", "call_id", "finish_reason", "object",
     "tool_choice", "response_format", "status", "name", "detail", "format"],
)  # fmt: skip
def test_structural_values_stay_for_replay(key: str) -> None:
    value = "sk-proj-abcdefghijklmnop1234"
    assert redact({key: value})[key] == value
