"""The request body is forwarded byte for byte; only the top-level model changes."""

from __future__ import annotations

import json

import orjson
import pytest

from kvmigrate.proxy.body import check_passthrough_body, parse_body, with_model
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
        # The only plain `"model":` pair is nested; the top-level key is escaped.
        b'{"mod\\u0065l": "gpt-4o-mini", "meta": {"model": "gpt-4o-mini"}}',
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


def test_escapes_in_values_survive_the_splice() -> None:
    """A client that escapes every non-ASCII character (Python's json.dumps does) still has
    its bytes forwarded as sent, bar the model."""
    raw = json.dumps(
        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "h\u00e9 \U0001f600"}]}
    ).encode()
    assert b"\\ud83d" in raw
    out = with_model(parse_body(raw), "llama")
    assert out == raw.replace(b'"gpt-4o-mini"', b'"llama"')


@pytest.mark.parametrize(
    "raw",
    [
        b'{"input": "hi", "meta": {"model": "gpt-4o-mini"}}',
        b'{"input": "hi", "model": null, "meta": {"model": "gpt-4o-mini"}}',
    ],
)
def test_a_body_without_a_top_level_model_gets_one_and_keeps_its_nested_one(raw: bytes) -> None:
    out = orjson.loads(with_model(parse_body(raw, require_model=False), "llama"))
    assert out["model"] == "llama"
    assert out["meta"] == {"model": "gpt-4o-mini"}


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


# The exact envelope a client gets: OpenAI's own wording where OpenAI has one, and `param`
# naming the field at fault, as OpenAI's errors do.
@pytest.mark.parametrize(
    ("raw", "message", "param"),
    [
        (b"", "The request body is empty; expected a JSON object.", None),
        (b"[1, 2]", "The request body must be a JSON object.", None),
        (b'{"messages": []}', "You must provide a model parameter.", "model"),
        (b'{"model": ""}', "You must provide a model parameter.", "model"),
        (b'{"model": "m", "stream": "yes"}', "`stream` must be a boolean.", "stream"),
        (b'{"model": "m", "stream": 1}', "`stream` must be a boolean.", "stream"),
        (b'{"model": "a", "model": "a"}', "The request body repeats the key `model`.", "model"),
        (
            b'{"model": "a", "n": 1, "model": "a", "n": 2}',
            "The request body repeats the key `model`.",
            "model",
        ),
        # The proxy routes a Responses turn to the backend holding the response it names:
        # read as the last one here, and as the first by a backend, it would continue
        # another chain than the one routed.
        (
            b'{"model": "a", "previous_response_id": "resp_1", "previous_response_id": "r2"}',
            "The request body repeats the key `previous_response_id`.",
            "previous_response_id",
        ),
    ],
)
def test_error_envelopes_are_exact(raw: bytes, message: str, param: str | None) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert (caught.value.status, caught.value.message, caught.value.param) == (400, message, param)
    assert caught.value.error_type == "invalid_request_error"


@pytest.mark.parametrize("raw", [b'{"messages": []}', b'{"model": null}', b'{"model": ""}'])
def test_a_route_without_a_model_reads_it_as_empty(raw: bytes) -> None:
    body = parse_body(raw, require_model=False)
    assert body.model == ""
    assert body.data == orjson.loads(raw)


@pytest.mark.parametrize(
    ("raw", "stream"),
    [(b'{"model": "m"}', False), (b'{"model": "m", "stream": false}', False),
     (b'{"model": "m", "stream": true}', True), (b'{"model": "m", "stream": null}', False)],
)  # fmt: skip
def test_stream_is_read_from_the_body(raw: bytes, stream: bool) -> None:
    assert parse_body(raw).stream is stream


@pytest.mark.parametrize(
    ("content_type", "raw", "status", "code"),
    [
        ("application/json", b"", None, None),  # no body: nothing to check
        ("text/plain", b"", None, None),
        ("application/json", b'{"file_id": "f"}', None, None),
        ("application/json", b"[1]", None, None),  # any JSON value: the upstream decides
        ("multipart/form-data", b"--x\r\n\xff", None, None),  # uploads are not parsed
        ("application/json", b"{not json", 400, None),
        ("text/plain", b"hello", 415, "unsupported_media_type"),
        ("application/x-www-form-urlencoded", b"a=1", 415, "unsupported_media_type"),
    ],
)
def test_passthrough_bodies(
    content_type: str, raw: bytes, status: int | None, code: str | None
) -> None:
    if status is None:
        check_passthrough_body(content_type, raw)
        return
    with pytest.raises(ProxyError) as caught:
        check_passthrough_body(content_type, raw)
    assert (caught.value.status, caught.value.code) == (status, code)
    if status == 400:
        assert caught.value.message.startswith("The request body is not valid JSON: ")
    else:
        assert caught.value.message == (
            "Send the request body as application/json or multipart/form-data."
        )
        assert caught.value.error_type == "invalid_request_error"


DEEP = b"[" * 1010 + b"1" + b"]" * 1010  # orjson reads 1024 levels; Python recurses 1000


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "gpt-4o-mini", "x": ' + DEEP + b', "y": "model"}',  # re-parsed: `model` twice
        b'{"model": "gpt-4o-mini", "x": ' + DEEP + b', "y": "\\u0041"}',  # re-parsed: a `\u0041`
    ],
)
def test_a_body_too_deep_to_check_for_repeated_keys_is_a_400(raw: bytes) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert caught.value.status == 400
    assert "too deeply" in caught.value.message


def test_a_body_too_deep_to_re_encode_is_a_400() -> None:
    # The key is escaped, so it is re-encoded, not spliced; orjson writes 255 levels at most.
    raw = b'{"mod\\u0065l": "gpt-4o-mini", "x": ' + b"[" * 300 + b"]" * 300 + b"}"
    with pytest.raises(ProxyError) as caught:
        with_model(parse_body(raw), "meta-llama/Llama-3.1-8B-Instruct")
    assert caught.value.status == 400
    assert "too deeply" in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [
        # The key once at the top and once inside an item: not a repeat.
        b'{"model": "m", "previous_response_id": "resp_1", "input": [{"previous_response_id": 1}]}',
        b'{"model": "m", "input": "the key \\"previous_response_id\\" twice: previous_response_id"}',
    ],
)
def test_a_chained_body_naming_its_key_again_below_the_top_is_taken(raw: bytes) -> None:
    assert parse_body(raw).data["model"] == "m"


# A long agent body: its `"model"` and escapes are found by `kvmigrate.bytescan`, each
# `\u00` looked at where it is (a tool's coloured output writes many `\u001b`).
COLOURED = b",".join(
    b'{"role": "tool", "content": "\\u001b[31mFAIL\\u001b[0m %d"}' % i for i in range(400)
)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"messages": [' + COLOURED + b'], "model": "a", "mod\\u0065l": "b"}',
        b'{"messages": [' + COLOURED + b'], "mod\\u0065l": "b", "model": "a"}',
        b'{"mod\\u0065l": "b", "messages": [' + COLOURED + b'], "model": "a"}',
        b'{"model": "a", "messages": [' + COLOURED + b'], "model": "b"}',
    ],
)
def test_a_long_body_repeating_its_model_is_refused(raw: bytes) -> None:
    with pytest.raises(ProxyError) as caught:
        parse_body(raw)
    assert "repeats the key `model`" in caught.value.message


def test_a_long_body_with_escaped_control_characters_keeps_its_model_splice() -> None:
    raw = b'{"messages": [' + COLOURED + b'], "model": "a"}'
    body = parse_body(raw)
    assert body.model_at == raw.find(b'"model"')
    assert orjson.loads(with_model(body, "served"))["model"] == "served"
