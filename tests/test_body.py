"""The request body is forwarded byte for byte; only the top-level model changes."""

from __future__ import annotations

import json

import orjson
import pytest

from kvmigrate.proxy.body import parse_body, with_model
from kvmigrate.proxy.errors import ProxyError

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "pick",
            "parameters": {"type": "object", "properties": {"model": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}',
        b'{"messages":[{"role":"user","content":"say \\"model\\": \\"x\\""}],"model":"gpt-4o-mini"}',
        json.dumps(
            {"tools": TOOLS, "model": "gpt-4o-mini", "metadata": {"model": "gpt-4o-mini"}}, indent=2
        ).encode(),
        json.dumps(
            {
                "messages": [{"role": "user", "content": "h\u00e9llo"}],
                "model": "gpt-4o-mini",
                "extra": {"model": "gpt-4o-mini"},
            }
        ).encode(),
        b'{"model" :  "gpt-4o-mini" ,"x-unknown-field": [1.0, 2e10, 123456789012345678901234567890]}',
        b'{"mod\\u0065l": "gpt-4o-mini", "n": 1}',
    ],
)
def test_only_the_top_level_model_changes(raw: bytes) -> None:
    body = parse_body(raw)
    out = with_model(body, "meta-llama/Llama-3.1-8B-Instruct")
    parsed = orjson.loads(out)
    assert parsed["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert {k: v for k, v in parsed.items() if k != "model"} == {
        k: v for k, v in body.data.items() if k != "model"
    }
    if b"\\u" not in raw:
        # Byte-exact apart from one model value: unknown fields, spacing and number spellings
        # survive.
        pieces = raw.split(b'"gpt-4o-mini"')
        one_replaced = {
            b'"gpt-4o-mini"'.join(pieces[: i + 1])
            + b'"meta-llama/Llama-3.1-8B-Instruct"'
            + b'"gpt-4o-mini"'.join(pieces[i + 1 :])
            for i in range(len(pieces) - 1)
        }
        assert out in one_replaced


def test_same_model_is_forwarded_untouched() -> None:
    raw = b'{"model":"m",  "messages":[]}'
    assert with_model(parse_body(raw), "m") is raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": []}', "model parameter"),
        (b'{"model": 5}', "model parameter"),
        (b'{"model": "m", "stream": "yes"}', "stream"),
        (b'\xff\xfe{"model": "m"}', "not valid JSON"),
    ],
)
def test_malformed_bodies_are_400(raw: bytes, message: str) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert caught.value.status == 400
    assert message in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "gpt-4-32k-not-allowed", "messages": [], "model": "gpt-4o-mini"}',
        b'{"model": "gpt-4o-mini", "stream": false, "model": "gpt-4o-mini", "stream": true}',
        b'{"model": "gpt-4o-mini", "mod\\u0065l": "other", "messages": []}',
        b'{"model": "a", "model": "a", "user": "u", "user": "v"}',
    ],
)
def test_a_repeated_top_level_key_is_refused(raw: bytes) -> None:
    """Issue 21 item 7: the proxy would check one value and the upstream might use the other."""
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert caught.value.status == 400
    assert "repeats the key" in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "x", "model": "inner"}]}',
        b'{"model": "m", "tools": [{"stream": 1}], "stream": true}',
        b'{"model": "m", "messages": [{"role": "user", "content": "caf\\u00e9"}]}',
    ],
)
def test_the_same_key_inside_nested_objects_is_fine(raw: bytes) -> None:
    assert parse_body(raw).model == "m"
