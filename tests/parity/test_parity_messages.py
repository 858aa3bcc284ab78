"""Parity over Anthropic Messages answers: the same comparators as chat, reading content
blocks (text, tool_use names and inputs), stop_reason and refusals, from recorded bytes
streamed or not."""

from __future__ import annotations

import json
from typing import Any

import messages_wire as mw
import pytest

from kvmigrate.parity import score_exchange_pair
from kvmigrate.parity.answer import extract_answer
from kvmigrate.parity.result import CANDIDATE_ERROR, COMPARED

REQUEST = mw.request(
    [{"role": "user", "content": "What is the capital of France?"}], tools=[mw.WEATHER_TOOL]
)
PARIS = "The capital of France is Paris, which sits on the Seine."


def score(
    primary: dict[str, Any],
    candidate: dict[str, Any],
    *,
    streamed: tuple[bool, bool] = (False, True),
    statuses: tuple[int, int] = (200, 200),
    request: dict[str, Any] = REQUEST,
) -> dict[str, bool]:
    """Verdicts by comparator for a recorded pair: the primary as a JSON body and the
    candidate streamed, unless told otherwise."""
    p = mw.stream(primary) if streamed[0] else mw.body(primary)
    c = mw.stream(candidate) if streamed[1] else mw.body(candidate)
    pair = score_exchange_pair("messages", mw.body(request), p, statuses[0], c, statuses[1])
    assert pair.outcome == COMPARED
    return {r.name: r.agree for r in pair.results}


def weather(arguments: dict[str, Any], call_id: str = "toolu_01T1x1fJ34qAmk2tNTrN7Up6") -> Any:
    return mw.message([mw.tool_use("get_weather", arguments, call_id)], stop_reason="tool_use")


def test_the_same_answer_streamed_and_not_agrees_everywhere() -> None:
    answer = mw.message([mw.text(PARIS)])
    verdicts = score(answer, answer)
    assert {"text", "topic", "finish_reason", "refusal", "length"} <= set(verdicts)
    assert all(verdicts.values()), verdicts


def test_a_message_reads_as_the_answer_a_chat_completion_gives() -> None:
    answer = extract_answer(
        mw.message(
            [
                mw.thinking("Paris, obviously."),
                mw.text("Paris."),
                *weather({"location": "Paris"})["content"],
            ],
            stop_reason="tool_use",
        )
    )
    assert answer.text == "Paris."  # thinking is not the answer's text
    assert answer.finish_reason == "tool_use"
    assert [(c.name, json.loads(c.arguments)) for c in answer.tool_calls] == [
        ("get_weather", {"location": "Paris"})
    ]
    assert answer.refusal is None


def test_tool_inputs_compare_by_value_and_names_must_match() -> None:
    primary = weather({"location": "Paris, FR", "unit": "celsius"})
    reordered = weather({"unit": "celsius", "location": "Paris, FR"}, "toolu_01A09q90qw90lq917835")
    assert score(primary, reordered)["tool_calls"] is True
    assert (
        score(primary, weather({"location": "Lyon, FR", "unit": "celsius"}))["tool_calls"] is False
    )
    other_tool = mw.message(
        [mw.tool_use("get_time", {"location": "Paris, FR"}, "toolu_01A09q90qw90lq917835")],
        stop_reason="tool_use",
    )
    assert score(primary, other_tool)["tool_calls"] is False


def test_a_tool_call_against_a_text_answer_disagrees_on_tools_and_stop_reason() -> None:
    verdicts = score(weather({"location": "Paris"}), mw.message([mw.text(PARIS)]))
    assert verdicts["tool_calls"] is False
    assert verdicts["finish_reason"] is False


@pytest.mark.parametrize(
    ("primary", "candidate", "agree"),
    [
        ("end_turn", "end_turn", True),
        ("end_turn", "stop_sequence", True),  # both ended on their own
        ("end_turn", "max_tokens", False),  # one was cut off
        ("max_tokens", "model_context_window_exceeded", True),
        ("end_turn", "refusal", False),
    ],
)
def test_stop_reasons_compare_in_one_vocabulary(primary: str, candidate: str, agree: bool) -> None:
    verdicts = score(
        mw.message([mw.text(PARIS)], stop_reason=primary),
        mw.message([mw.text(PARIS)], stop_reason=candidate),
    )
    assert verdicts["finish_reason"] is agree


def test_a_refusal_stop_is_a_refusal_even_with_no_apology_in_the_text() -> None:
    refused = mw.message([], stop_reason="refusal")
    verdicts = score(mw.message([mw.text(PARIS)]), refused)
    assert verdicts["refusal"] is False
    assert score(refused, refused)["refusal"] is True
    apology = mw.message([mw.text("I'm sorry, but I can't help with that request.")])
    assert score(mw.message([mw.text(PARIS)]), apology)["refusal"] is False


def test_vllms_usage_without_cache_fields_is_no_shape_difference() -> None:
    hosted = mw.message([mw.text(PARIS)])
    hosted["usage"] |= {
        "cache_creation": {"ephemeral_5m_input_tokens": 0},
        "service_tier": "standard",
    }
    vllm = mw.message([mw.text(PARIS)], use={"input_tokens": 20, "output_tokens": 10})
    vllm["kv_transfer_params"] = {"do_remote_decode": False}
    assert score(hosted, vllm, streamed=(False, False))["api_shape"] is True
    missing_role = {k: v for k, v in vllm.items() if k != "role"}
    assert score(hosted, missing_role, streamed=(False, False))["api_shape"] is False


def test_an_overloaded_candidate_is_a_candidate_error_in_anthropics_envelope() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    pair = score_exchange_pair(
        "messages", mw.body(REQUEST), mw.body(mw.message([mw.text(PARIS)])), 200,
        json.dumps(overloaded).encode(), 529,
    )  # fmt: skip
    assert pair.outcome == CANDIDATE_ERROR
    api_shape = pair.get("api_shape")
    assert api_shape is not None
    assert api_shape.agree is False


def test_an_error_event_inside_a_200_stream_is_a_candidate_error() -> None:
    """Anthropic reports a failure after the stream began as an `error` event."""
    answer = mw.message([mw.text(PARIS)])
    broken = mw.stream(answer).split(b"event: content_block_stop")[0] + (
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
        b'"message":"Overloaded"}}\n\n'
    )
    pair = score_exchange_pair("messages", mw.body(REQUEST), mw.body(answer), 200, broken, 200)
    assert pair.outcome == CANDIDATE_ERROR


def test_structured_output_requests_are_checked_against_their_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    request = {**REQUEST, "output_config": {"format": {"type": "json_schema", "schema": schema}}}
    good = mw.message([mw.text('{"city": "Paris"}')])
    bad = mw.message([mw.text('{"town": "Paris"}')])
    assert score(good, good, request=request)["structured"] is True
    assert score(good, bad, request=request)["structured"] is False
