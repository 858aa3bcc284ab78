"""Secrets known by their name: the whole value goes, however it is written (quoted with
spaces, JSON-escaped, in backticks, bare), and a JSON member whose key names a secret goes
whatever its type. Near-miss names stay. Linear time on hostile input."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvmigrate.named_secrets import is_secret_name
from kvmigrate.redaction import SECRET, Redactor, redact, redact_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('passphrase: "correct horse battery staple"', f'passphrase: "{SECRET}"'),
        ("passphrase: 'correct horse battery staple'", f"passphrase: '{SECRET}'"),
        ("passphrase = `correct horse battery staple`", f"passphrase = `{SECRET}`"),
        ('{"password": "hunter2 horse"}', f'{{"password": "{SECRET}"}}'),
        ('{"password": "a \\"quoted\\" word"}', f'{{"password": "{SECRET}"}}'),
        # A JSON document inside a JSON string: its quotes are escaped once more.
        ('{"c": "{\\"password\\": \\"hunter2 horse\\"}"}', f'{{"c": "{{\\"password\\": \\"{SECRET}\\"}}"}}'),
        ('{"c": "{\\"pwd\\": \\"a \\\\\\"b\\\\\\" c\\"}"}', f'{{"c": "{{\\"pwd\\": \\"{SECRET}\\"}}"}}'),
        ("DB_PASSWORD=s3cr3t! and more", f"DB_PASSWORD={SECRET} and more"),
        ("DB_PASS=s3cr3t, then", f"DB_PASS={SECRET}, then"),
        ("accessToken: abc.def", f"accessToken: {SECRET}"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG", f"aws_secret_access_key = {SECRET}"),
        ("Authorization: Basic dXNlcjpwYXNz ok", f"Authorization: {SECRET} ok"),
        ('password: "unclosed to the end\nnext line', f'password: "{SECRET}\nnext line'),
        ('{"password": 123456}', f'{{"password": {SECRET}}}'),
    ],
)  # fmt: skip
def test_a_named_value_goes_whole(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "passage: a long passage of text",
        "keyboard: qwerty layout",
        "the key to success is hard work; max_tokens: 100",
        "secretary: Jane Smith",
        "author: Jane Smith",
        "tokenizer: bpe model",
        "passport: see the office",
        "monkey: banana eater",
    ],
)
def test_a_near_miss_name_keeps_its_value(text: str) -> None:
    assert redact_text(text) == text


def test_a_tool_use_input_member_naming_a_secret_goes_whatever_its_type() -> None:
    block = {
        "type": "tool_use",
        "id": "toolu_01",
        "name": "login",
        "input": {
            "password": "hunter2 horse",
            "pin": 1234,
            "apiKey": 5,
            "client_secret": ["a", "b"],
            "credentials": {"user": "bob", "note": "x"},
            "tokens": 12,
            "passage": "kept as it is",
            "refresh_token": None,
        },
    }
    out = Redactor()(block)
    assert out["input"] == {
        "password": SECRET,
        "pin": 1234,
        "apiKey": SECRET,
        "client_secret": SECRET,
        "credentials": SECRET,
        "tokens": 12,
        "passage": "kept as it is",
        "refresh_token": None,
    }
    assert redact(block) == out


def test_function_arguments_are_scrubbed_as_the_json_object_they_hold() -> None:
    arguments = json.dumps({"host": "db1", "password": "hunter2 horse", "db": {"pwd": 42}})
    body = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
             "function": {"name": "connect", "arguments": arguments}}]},
        ],
        # A Responses API function call item.
        "input": [{"type": "function_call", "call_id": "c2", "name": "connect",
                   "arguments": arguments}],
    }  # fmt: skip
    out = Redactor()(body)
    stored = out["messages"][0]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(stored) == {"host": "db1", "password": SECRET, "db": {"pwd": SECRET}}
    assert json.loads(out["input"][0]["arguments"]) == json.loads(stored)
    assert "hunter2" not in json.dumps(out)
    assert "42" not in stored


def test_arguments_without_a_secret_name_keep_their_text() -> None:
    arguments = '{"city":  "Paris"}'  # spacing as sent: not rewritten
    out = Redactor()({"function": {"name": "weather", "arguments": arguments}})
    assert out["function"]["arguments"] == arguments


def test_a_logprobs_token_is_answer_text_not_a_secret() -> None:
    entry = {"token": "Hello", "logprob": -0.1, "bytes": [72], "top_logprobs": []}
    assert Redactor()({"logprobs": {"content": [entry]}}) == {"logprobs": {"content": [entry]}}


# Letters no key name or placeholder holds, so any survivor is the secret's own.
_WORD = st.text(alphabet="abcxyz0189жé漢", min_size=4, max_size=8)
_GLUE = st.sampled_from(["", '"', "'", "`", "\\", '\\"', "é", " ", "  "])
_KEYS = st.sampled_from(
    ["password", "passphrase", "api_key", "x-api-key", "client_secret", "authToken",
     "DB_PASSWORD", "secret", "pwd", "private_key", "access_token", "credentials"]
)  # fmt: skip


@st.composite
def _secret_values(draw: st.DrawFn) -> str:
    words = draw(st.lists(_WORD, min_size=1, max_size=5))
    glue = draw(st.lists(_GLUE, min_size=len(words), max_size=len(words)))
    return " ".join(w + g for w, g in zip(words, glue, strict=True))


def _words(value: str) -> list[str]:
    return [w for w in "".join(c if c.isalnum() else " " for c in value).split() if len(w) >= 4]


def _survivors(value: str, redacted: str) -> list[str]:
    return [word for word in _words(value) if word in redacted]


@settings(max_examples=300, deadline=None)
@given(_KEYS, _secret_values(), st.sampled_from([": ", "=", " = ", ":=", "=>"]))
def test_no_word_of_a_json_quoted_secret_survives(key: str, value: str, op: str) -> None:
    for text in (
        f"note {key}{op}{json.dumps(value)} end",
        f"note {key}{op}{json.dumps(value, ensure_ascii=False)} end",
        json.dumps({key: value}, ensure_ascii=False),
        json.dumps({"outer": json.dumps({key: value}, ensure_ascii=False)}, ensure_ascii=False),
        json.dumps({"o": json.dumps({"i": json.dumps({key: value})})}),
    ):
        assert _survivors(value, redact_text(text)) == [], text
    assert redact_text(f"note {key}{op}{json.dumps(value)} end").endswith(" end")


@settings(max_examples=300, deadline=None)
@given(_KEYS, _secret_values(), st.sampled_from(["'", "`", '"']))
def test_no_word_of_a_plainly_quoted_secret_survives(key: str, value: str, quote: str) -> None:
    value = value.replace("\\", "").replace(quote, "")
    assume(_words(value))
    redacted = redact_text(f"then {key}: {quote}{value}{quote} and after")
    assert _survivors(value, redacted) == []
    assert redacted.endswith(" and after")


@settings(max_examples=300, deadline=None)
@given(_KEYS, _WORD)
def test_no_bare_secret_survives(key: str, value: str) -> None:
    assert value not in redact_text(f"{key}={value} rest")


@settings(max_examples=300, deadline=None)
@given(_KEYS, st.one_of(_secret_values(), st.integers(), st.lists(_WORD, max_size=3)))
def test_no_part_of_a_json_member_naming_a_secret_survives(key: str, value: Any) -> None:
    body = {"type": "tool_use", "input": {"nested": [{key: value}]}}
    call = {"function": {"name": "f", "arguments": json.dumps({"a": {key: value}})}}
    for out in (Redactor()(body), Redactor()(call)):
        dumped = json.dumps(out, ensure_ascii=False)
        assert _survivors(json.dumps(value, ensure_ascii=False), dumped) == []


_NEAR_MISSES = st.sampled_from(
    ["passage", "keyboard", "passenger", "tokenizer", "max_tokens", "secretary", "monkey",
     "author", "passport", "keys", "sort_key", "cookies_eaten", "authority", "tokens"]
)  # fmt: skip
_PLAIN = st.text(alphabet="abcdefghij ", min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(_NEAR_MISSES, _PLAIN, st.sampled_from([": ", "=", '": "']))
def test_a_near_miss_name_is_not_redacted(key: str, value: str, op: str) -> None:
    assume(value.strip())
    text = f'"{key}{op}{value}"' if op.startswith('"') else f"{key}{op}{value}"
    assert redact_text(text) == text
    assert Redactor()({"input": {key: value}}) == {"input": {key: value}}
    assert not is_secret_name(key)


_ADVERSARIAL = {
    "names without values": "password " * 100_000,
    "names and unclosed quotes": 'password: "x\n' * 80_000,
    "unclosed quotes on one line": "password: 'x " * 80_000,
    "escaped quotes that never close": 'password: \\"' + '\\\\\\"a' * 200_000,
    "backslashes after a name": "password" + "\\" * 1_000_000,
    "prefixes of a name": "a_" * 500_000 + " key",
    "camel humps": "aB" * 500_000,
    "vendor key prefixes": "sk-" * 330_000,
    "address dots": "a." * 500_000 + "@",
    "phone-like run": "1.(" * 330_000,
    "phone-like run 2": "(1-" * 330_000,
    "domain dots": "a@" + "a." * 500_000,
}


@pytest.mark.parametrize("text", _ADVERSARIAL.values(), ids=_ADVERSARIAL.keys())
def test_a_megabyte_of_hostile_text_is_redacted_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    redact_text(text)
    # Linear: well under a second on a laptop; quadratic: hours.
    assert time.perf_counter() - started < 10
