"""Anthropic Messages answers, streamed and not, read back into one Message, its usage and
its record: what parity, TTFT-by-turn, cache-hit-by-turn and the cost projection read."""

from __future__ import annotations

import json
import time
from typing import Any

import messages_wire as mw
import pytest

from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder.convert import to_record
from kvmigrate.wire.assemble import assemble

# A stream as Anthropic's API reference shows it, byte for byte in its framing (a `ping`
# with a space after the colon, the input usage in message_start only).
DOCS_STREAM = b"""event: message_start
data: {"type": "message_start", "message": {"id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY", "type": "message", "role": "assistant", "content": [], "model": "claude-opus-4-6", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 25, "output_tokens": 1}}}

event: content_block_start
data: {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}

event: content_block_delta
data: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}

event: content_block_stop
data: {"type": "content_block_stop", "index": 0}

event: message_delta
data: {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence":null}, "usage": {"output_tokens": 15}}

event: message_stop
data: {"type": "message_stop"}

"""

ANSWERS = {
    "text": mw.message([mw.text("The capital of France is Paris, on the Seine.")]),
    "tool_use": mw.message(
        [
            mw.text("I'll check the weather."),
            mw.tool_use("get_weather", {"location": "Paris, FR", "days": [1, 2]}, "toolu_01A09q"),
        ],
        stop_reason="tool_use",
        use=mw.usage(3, 40, read=480, write=12),
    ),
    "thinking": mw.message(
        [mw.thinking("The user wants a number; 6 times 7 is 42."), mw.text("42.")],
        stop_reason="max_tokens",
        use=mw.usage(9, 64, write=500),
    ),
    "refusal": mw.message([mw.text("I can't help with that.")], stop_reason="refusal"),
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_stream_reassembles_into_the_message_it_streams(name: str) -> None:
    full = ANSWERS[name]
    assert assemble("messages", mw.stream(full)) == full
    assert assemble("messages", mw.body(full)) == full


def test_the_api_references_stream_reassembles() -> None:
    out = assemble("messages", DOCS_STREAM)
    assert out is not None
    assert out["content"] == [{"type": "text", "text": "Hello!"}]
    assert (out["stop_reason"], out["stop_sequence"]) == ("end_turn", None)
    assert out["usage"] == {"input_tokens": 25, "output_tokens": 15}


def test_a_stream_cut_short_keeps_what_arrived() -> None:
    full = ANSWERS["tool_use"]
    events = mw.stream(full).split(b"\n\n")
    first_piece = next(i for i, e in enumerate(events) if b'"partial_json":"{' in e)
    cut = b"\n\n".join(events[: first_piece + 4])  # 4 of the tool input's 5-char pieces
    out = assemble("messages", cut)
    assert out is not None
    assert out["content"][0] == mw.text("I'll check the weather.")
    assert out["content"][1]["name"] == "get_weather"
    partial = json.dumps(full["content"][1]["input"])[:20]
    assert out["content"][1]["input"] == partial  # the text as sent, not an object
    assert out["stop_reason"] is None  # message_delta never came


def _exchange(
    answer: bytes, stream: bool, role: Role = Role.SERVE, size: int = 37, **kw: Any
) -> Exchange:
    now = time.monotonic()
    x = Exchange(
        request_id=kw.pop("request_id", "r1"),
        route="messages",
        backend=kw.pop("backend", "anthropic"),
        role=role,
        model=mw.MODEL,
        served_model=mw.MODEL,
        conversation="h:" + "a" * 24,
        turn=kw.pop("turn", 1),
        stream=stream,
        started=now,
        request_body=mw.body(mw.request([{"role": "user", "content": "Hi"}], stream_it=stream)),
        status=200,
        first_byte=now + 0.05,
        finished=now + 0.2,
        **kw,
    )
    x.chunks.extend(mw.chunks(answer, size))
    return x


@pytest.mark.parametrize(
    ("stream", "size"),
    # 7-byte chunks cut message_start across the first eight: the whole body is read then.
    [(True, 7), (True, 37), (True, 100_000), (False, 37)],
)
def test_token_counts_split_cache_reads_and_writes_from_plain_input(
    stream: bool, size: int
) -> None:
    full = ANSWERS["tool_use"]
    x = _exchange(mw.stream(full) if stream else mw.body(full), stream, size=size)
    assert x.usage == full["usage"]
    # prompt = plain input + cache reads + cache writes; cached = reads.
    assert x.token_counts() == {"prompt": 495, "completion": 40, "cached": 480, "cache_write": 12}


def test_usage_from_message_delta_replaces_the_starts_counts() -> None:
    """vLLM's /v1/messages sends the whole usage in message_delta, with the cache read that
    message_start (sent before the prompt was scheduled) did not know yet."""
    full = mw.message([mw.text("ok")], use=mw.usage(500, 1))
    wire = mw.stream(full).replace(
        b'"usage":{"output_tokens":1}',
        b'"usage":{"input_tokens":20,"output_tokens":2,"cache_read_input_tokens":480}',
    )
    x = _exchange(wire, stream=True)
    assert x.token_counts() == {"prompt": 500, "completion": 2, "cached": 480, "cache_write": 0}
    assert assemble("messages", wire)["usage"]["cache_read_input_tokens"] == 480  # type: ignore[index]


@pytest.mark.parametrize("stream", [True, False])
def test_a_messages_record_holds_tokens_stop_reason_and_tool_names(stream: bool) -> None:
    full = ANSWERS["tool_use"]
    x = _exchange(mw.stream(full) if stream else mw.body(full), stream)
    record = to_record(x, time.time(), "redacted", "test")
    assert (record.prompt_tokens, record.cached_tokens, record.cache_write_tokens) == (495, 480, 12)
    assert record.completion_tokens == 40
    assert record.finish_reason == "tool_use"
    assert record.tool_calls == '["get_weather"]'
    assert (record.ttft_ms is not None) is stream
    assert record.response_json is not None
    assert '"toolu_01A09q"' in record.response_json
    # The history is stored apart, as for chat: the body less `messages`, and its digests.
    assert record.request_json is not None
    assert '"messages"' not in record.request_json
    assert record.request_messages is not None
    assert '"messages"' in record.request_messages


def test_redaction_keeps_a_messages_structure_and_scrubs_its_content() -> None:
    """tool_use_id and stop_reason are structure (Anthropic's tool_call_id and
    finish_reason): a 32-hex tool id from vLLM would otherwise read as a secret."""
    from kvmigrate.redaction import SECRET, Redactor

    call_id = "chatcmpl-tool-" + "9f8e7d6c5b4a39281706f5e4d3c2b1a0"
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": "mail ann@example.com",
                    },
                ],
            }
        ],
    }
    out = Redactor()(body)
    block = out["messages"][0]["content"][0]
    assert block["tool_use_id"] == call_id
    assert block["content"] == "mail [EMAIL]"
    assert Redactor()({"stop_reason": "end_turn", "x": "sk-ant-api03-" + "a1" * 20}) == {
        "stop_reason": "end_turn",
        "x": SECRET,
    }
