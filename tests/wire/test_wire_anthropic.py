"""Anthropic's wire: error envelopes by status, the mapping of a backend's error answers,
a streamed answer reassembled, and a Messages conversation's identity."""

from __future__ import annotations

import orjson
import pytest

from kvmigrate.policies.conversation import conversation_key, declared_key
from kvmigrate.proxy.envelopes import ANTHROPIC, envelope_for_path
from kvmigrate.wire.anthropic import anthropic_error_body, error_body, error_event
from kvmigrate.wire.anthropic_stream import assemble_messages


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),  # other 4xx, as the API reference says
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_type_by_status(status: int, kind: str) -> None:
    assert orjson.loads(error_body(status, "m")) == {
        "type": "error",
        "error": {"type": kind, "message": "m"},
    }


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        # vLLM's /v1/messages: its exception class name as the type
        (400, {"type": "error", "error": {"type": "BadRequestError", "message": "bad"}}, "bad"),
        (401, {"error": "Unauthorized"}, "Unauthorized"),  # vLLM's auth middleware
        (404, {"detail": "Not Found"}, "Not Found"),  # FastAPI
        (429, {"error": {"message": "slow down", "type": "requests", "code": None}}, "slow down"),
    ],
)
def test_backend_errors_are_mapped_into_anthropics_envelope(
    status: int, body: dict[str, object], message: str
) -> None:
    mapped = anthropic_error_body(status, orjson.dumps(body))
    assert mapped is not None
    assert orjson.loads(mapped) == orjson.loads(error_body(status, message))


def test_an_anthropic_error_or_unreadable_body_is_relayed_as_it_came() -> None:
    assert anthropic_error_body(404, error_body(404, "model: x")) is None
    assert anthropic_error_body(502, b"<html>bad gateway</html>") is None


def test_error_event_is_a_named_sse_event() -> None:
    event = error_event("api_error", "broke")
    assert event.startswith(b"event: error\ndata: ")
    assert event.endswith(b"\n\n")
    assert orjson.loads(event.split(b"data: ")[1])["error"] == {
        "type": "api_error",
        "message": "broke",
    }


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [
        ("/v1/messages", True),
        ("/v1/messages/count_tokens", True),
        ("/v1/messages/batches/msgbatch_1", True),  # passes through, errors still Anthropic's
        ("/v1/messagesx", False),
        ("/v1/chat/completions", False),
        ("/health", False),
    ],
)
def test_the_envelope_follows_the_path(path: str, anthropic: bool) -> None:
    assert (envelope_for_path(path) is ANTHROPIC) is anthropic


def _sse(*events: dict[str, object]) -> bytes:
    return b"".join(
        b"event: " + str(e["type"]).encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
        for e in events
    )


def test_a_streamed_answer_reassembles_into_the_whole_message() -> None:
    start_usage = {"input_tokens": 5, "cache_read_input_tokens": 90, "output_tokens": 1}
    body = _sse(
        {"type": "message_start", "message": {"id": "msg_1", "content": [], "usage": start_usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "you"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "signature_delta", "signature": "s1"}},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
        },
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"a": '}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "1}"}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"output_tokens": 12},
        },
        {"type": "message_stop"},
    )  # fmt: skip
    message = assemble_messages(body)
    assert message == {
        "id": "msg_1",
        "content": [
            {"type": "text", "text": "Hi you"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
            {"type": "thinking", "thinking": "hmm", "signature": "s1"},
        ],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 90, "output_tokens": 12},
        "stop_reason": "tool_use",
        "stop_sequence": None,
    }


def test_a_stream_without_message_start_is_not_a_message() -> None:
    assert assemble_messages(b"data: {}\n\n") is None


def _turn(system: object, first: object) -> dict[str, object]:
    return {"model": "c", "system": system, "messages": [{"role": "user", "content": first}]}


def test_the_opening_includes_the_top_level_system_prompt() -> None:
    one = conversation_key({}, _turn("You are A.", "hi"), "c")
    other = conversation_key({}, _turn("You are B.", "hi"), "c")
    assert one.source == "prefix"
    assert one != other


def test_a_moved_cache_breakpoint_keeps_the_opening() -> None:
    """Agents mark their newest message each turn; the opening must not change with it."""
    marked = [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]
    plain = [{"type": "text", "text": "hi"}]
    system = [{"type": "text", "text": "You are A.", "cache_control": {"type": "ephemeral"}}]
    assert conversation_key({}, _turn(system, marked), "c") == conversation_key(
        {}, _turn(system, plain), "c"
    )


def test_metadata_user_id_declares_a_messages_conversation_only() -> None:
    body = {"metadata": {"user_id": "u-1"}}
    declared = declared_key({}, body, "messages")
    assert declared is not None
    assert (declared.value, declared.source) == ("user:u-1", "user")
    assert declared_key({}, body, "chat/completions") is None  # chat's metadata is free-form
