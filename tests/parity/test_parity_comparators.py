"""Each comparator on hand-made pairs, and `compare`/`score_exchange_pair` end to end."""

from __future__ import annotations

import json
from typing import Any

import pytest
from parity_support import VLLM_MODEL, chat_response, emulator, tool_call

from kvmigrate.parity import Outcome, compare, score_exchange_pair
from kvmigrate.parity.answer import extract_answer
from kvmigrate.parity.finish import canonical_finish
from kvmigrate.parity.result import BOTH_ERROR, CANDIDATE_ERROR, PRIMARY_ERROR

REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}


def verdicts(
    primary: dict[str, Any], candidate: dict[str, Any], request: Any = None
) -> dict[str, bool]:
    score = compare(request or REQUEST, primary, candidate)
    return {r.name: r.agree for r in score.results}


def test_identical_answers_agree_everywhere() -> None:
    score = compare(REQUEST, chat_response(), chat_response())
    assert score.agree
    assert score.score == pytest.approx(1.0)
    assert {"text", "topic", "finish_reason", "refusal", "length", "api_shape"} <= score.applicable


def test_text_equal_after_normalisation() -> None:
    result = compare(REQUEST, chat_response("Paris is  the capital\nof France."),
                     chat_response("PARIS is the capital of France."))  # fmt: skip
    text = result.get("text")
    assert text is not None
    assert text.agree
    assert text.score == 1.0


def test_text_on_another_topic_disagrees() -> None:
    other = chat_response("Photosynthesis turns sunlight, water and carbon dioxide into sugar.")
    result = verdicts(chat_response(), other)
    assert result["text"] is False
    assert result["topic"] is False


def test_tool_ids_compare_by_shape_and_arguments_by_value() -> None:
    primary = chat_response(None, finish="tool_calls",
                            tool_calls=[tool_call("get_weather", {"city": "Paris", "unit": "c"})])  # fmt: skip
    candidate = chat_response(None, finish="tool_calls", tool_calls=[tool_call(
        "get_weather", '{ "unit": "c",  "city": "Paris" }', "chatcmpl-tool-9f8e7d6c5b4a")])  # fmt: skip
    assert verdicts(primary, candidate)["tool_calls"] is True


@pytest.mark.parametrize(
    ("candidate_call", "problem"),
    [
        (tool_call("get_time", {"city": "Paris", "unit": "c"}), "names"),
        (tool_call("get_weather", {"city": "Lyon", "unit": "c"}), "city"),
        (tool_call("get_weather", '{"city": "Paris", "unit": "c"'), "not valid JSON"),
        (tool_call("get_weather", {"city": "Paris", "unit": "c"}, call_id=""), "call ids"),
    ],
)
def test_tool_call_divergences(candidate_call: dict[str, Any], problem: str) -> None:
    primary = chat_response(None, finish="tool_calls",
                            tool_calls=[tool_call("get_weather", {"city": "Paris", "unit": "c"})])  # fmt: skip
    candidate = chat_response(None, finish="tool_calls", tool_calls=[candidate_call])
    result = compare(REQUEST, primary, candidate).get("tool_calls")
    assert result is not None
    assert not result.agree
    assert problem in result.detail


def test_per_argument_agreement_is_reported() -> None:
    primary = chat_response(None, finish="tool_calls",
                            tool_calls=[tool_call("f", {"a": 1, "b": 2, "c": 3, "d": 4})])  # fmt: skip
    candidate = chat_response(None, finish="tool_calls",
                              tool_calls=[tool_call("f", {"a": 1, "b": 2, "c": 3, "d": 5})])  # fmt: skip
    result = compare(REQUEST, primary, candidate).get("tool_calls")
    assert result is not None
    assert result.data["arguments"][0]["agreement"] == pytest.approx(0.75)
    assert result.data["arguments"][0]["differing"] == ["d"]


def test_parallel_calls_match_by_name_not_position() -> None:
    calls = [tool_call("a", {"x": 1}), tool_call("b", {"y": 2})]
    primary = chat_response(None, finish="tool_calls", tool_calls=calls)
    candidate = chat_response(None, finish="tool_calls", tool_calls=list(reversed(calls)))
    assert verdicts(primary, candidate)["tool_calls"] is True


def test_structured_output_against_the_request_schema() -> None:
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    request = {**REQUEST, "response_format": {"type": "json_schema",
               "json_schema": {"name": "x", "schema": schema}}}  # fmt: skip
    good = chat_response('{"n": 3}')
    assert verdicts(good, chat_response('{"n": 4}'), request)["structured"] is True
    assert verdicts(good, chat_response('{"n": "four"}'), request)["structured"] is False
    assert verdicts(good, chat_response('{"n": 3'), request)["structured"] is False
    # Better than the primary is no regression.
    assert verdicts(chat_response('{"n": '), good, request)["structured"] is True


def test_json_answer_without_response_format_is_still_checked() -> None:
    result = verdicts(chat_response('{"a": [1, 2]}'), chat_response('{"a": [1, 2'))
    assert result["structured"] is False


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [("stop", "eos", True), ("tool_calls", "function_call", True), ("length", "max_tokens", True),
     ("stop", "length", False), ("content_filter", "stop", False)],
)  # fmt: skip
def test_finish_reason_vocabulary(a: str, b: str, same: bool) -> None:
    assert (canonical_finish(a) == canonical_finish(b)) is same
    assert verdicts(chat_response(finish=a), chat_response(finish=b))["finish_reason"] is same


@pytest.mark.parametrize(
    "candidate",
    [
        chat_response("I'm sorry, but I can't help with that."),
        chat_response("I cannot assist with that request."),
        chat_response("As an AI language model, I cannot browse the internet."),
        chat_response(None, refusal="I can't help with that."),
    ],
)
def test_refusals_are_detected(candidate: dict[str, Any]) -> None:
    assert verdicts(chat_response(), candidate)["refusal"] is False


def test_an_apology_that_answers_is_not_a_refusal() -> None:
    answer = chat_response("Sorry for the confusion earlier: Paris is the capital of France.")
    assert verdicts(chat_response(), answer)["refusal"] is True


def test_truncated_answer_disagrees_on_length_and_finish() -> None:
    full = chat_response("Paris is the capital of France. It has been since the tenth century.")
    cut = chat_response("Paris is the capital of France. It has been", finish="length")
    result = verdicts(full, cut)
    assert result["finish_reason"] is False
    assert result["length"] is False


def test_vllm_answer_has_the_hosted_shape(tmp_path: Any) -> None:
    """Real emulator bodies: vLLM's known extras and nulls are allowed."""
    body = {"messages": [{"role": "user", "content": "Explain the history of chess."}]}
    import urllib.request

    def post(url: str, model: str, stream: bool) -> bytes:
        data = json.dumps({**body, "model": model, "stream": stream}).encode()
        req = urllib.request.Request(url + "/v1/chat/completions", data=data,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=10) as response:
            return bytes(response.read())

    with emulator("hosted") as hosted, emulator("vllm") as vllm:
        for stream in (False, True):
            primary = post(hosted.url, "gpt-4o-mini", stream)
            candidate = post(vllm.url, VLLM_MODEL, stream)
            score = score_exchange_pair("chat/completions", json.dumps(body).encode(),
                                        primary, 200, candidate, 200)  # fmt: skip
            shape = score.get("api_shape")
            assert shape is not None
            assert shape.agree, shape.detail


def test_missing_fields_count_against_the_shape() -> None:
    primary = chat_response(system_fingerprint="fp_1")
    candidate = chat_response()
    del candidate["usage"]
    candidate["created"] = None
    shape = compare(REQUEST, primary, candidate).get("api_shape")
    assert shape is not None
    assert not shape.agree
    assert "usage" in shape.detail
    assert "created" in shape.detail
    assert "system_fingerprint" not in shape.detail


def _error(status: int, body: dict[str, Any]) -> Outcome:
    return Outcome(status, body, body)


def test_error_envelopes() -> None:
    nested = {"error": {"message": "bad", "type": "invalid_request_error", "code": "x"}}
    nested_numeric = {"error": {"message": "bad", "type": "BadRequestError", "code": 400}}
    flat = {"object": "error", "message": "bad", "type": "BadRequestError", "code": 400}
    same = compare(REQUEST, _error(400, nested), _error(400, nested_numeric))
    assert same.outcome == BOTH_ERROR
    assert same.agree
    assert "code int vs str" in same.results[0].detail
    assert not compare(REQUEST, _error(400, nested), _error(400, flat)).agree
    assert not compare(REQUEST, _error(400, nested), _error(500, nested)).agree
    failed = compare(REQUEST, chat_response(), _error(500, nested))
    assert failed.outcome == CANDIDATE_ERROR
    assert failed.score == 0.0
    no_answer = compare(REQUEST, chat_response(), Outcome(None, None))
    assert no_answer.outcome == CANDIDATE_ERROR
    assert not no_answer.agree


def test_a_failed_primary_is_not_scored() -> None:
    score = compare(REQUEST, _error(500, {"error": {"message": "x"}}), chat_response())
    assert score.outcome == PRIMARY_ERROR
    assert not score.scorable
    assert score.score is None


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )


def test_streamed_tool_calls_are_reassembled() -> None:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    primary = _sse([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "call_abcdefghijk", "type": "function",
             "function": {"name": "get_weather", "arguments": ""}}]}}]},
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"city": "Pa'}}]}}]},
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'ris"}'}}]}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ])  # fmt: skip
    # vLLM's parser may send the arguments in one piece.
    candidate = _sse([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
            {"index": 0, "id": "chatcmpl-tool-0123456789ab", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ])  # fmt: skip
    score = score_exchange_pair("chat/completions", json.dumps(REQUEST).encode(),
                                primary, 200, candidate, 200)  # fmt: skip
    assert score.agree, score.to_dict()
    assert "tool_calls" in score.applicable


def test_an_error_event_inside_a_200_stream_is_an_error() -> None:
    candidate = b'data: {"error": {"message": "upstream broke", "type": "server_error"}}\n\n'
    body = json.dumps(chat_response()).encode()
    score = score_exchange_pair("chat/completions", b"{}", body, 200, candidate, 200)
    assert score.outcome == CANDIDATE_ERROR
    assert not score.agree


def test_responses_api_answers_are_read() -> None:
    response = {"object": "response", "status": "completed", "output": [
        {"type": "function_call", "call_id": "call_abcdefghijk", "name": "f", "arguments": "{}"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Done."}]},
    ]}  # fmt: skip
    answer = extract_answer(response)
    assert answer.text == "Done."
    assert [c.name for c in answer.tool_calls] == ["f"]
    assert answer.finish_reason == "tool_calls"


def test_scoring_is_cheap() -> None:
    import time

    body = json.dumps(chat_response("word " * 400 + ".")).encode()
    started = time.perf_counter()
    for _ in range(200):
        score_exchange_pair("chat/completions", json.dumps(REQUEST).encode(), body, 200, body, 200)
    # 0.4 ms per pair on the quiet 2-core machine: 5 ms is a 12x margin.
    assert (time.perf_counter() - started) / 200 < 0.005


class _FakeScorer:
    """Stands in for the MiniLM model: similarity by shared words."""

    def similarity(self, a: str, b: str) -> float:
        x, y = set(a.lower().split()), set(b.lower().split())
        return len(x & y) / len(x | y)


def test_semantic_comparator_is_optional() -> None:
    from kvmigrate.parity import load_semantic, semantic_available

    if not semantic_available():
        assert load_semantic() is None
    plain = compare(REQUEST, chat_response(), chat_response())
    assert "semantic" not in plain.applicable
    scored = compare(REQUEST, chat_response(), chat_response("Bananas are yellow."),
                     semantic=_FakeScorer())  # fmt: skip
    result = scored.get("semantic")
    assert result is not None
    assert not result.agree


def _custom(name: str, text: str) -> dict[str, Any]:
    return {"id": "call_1", "type": "custom", "custom": {"name": name, "input": text}}


@pytest.mark.parametrize(
    ("candidate", "agree"),
    [
        (_custom("apply_patch", "*** Begin Patch\n+x = 1\n*** End Patch"), True),
        (_custom("apply_patch", "*** Begin Patch\n+x = 2\n*** End Patch"), False),
        (_custom("run_sql", "*** Begin Patch\n+x = 1\n*** End Patch"), False),
    ],
)
def test_custom_tool_calls_compare_by_name_and_input(
    candidate: dict[str, Any], agree: bool
) -> None:
    """OpenAI's custom tools (free-text `input`, no `function`): two different calls read
    as the same nameless, empty call before."""
    primary_call = _custom("apply_patch", "*** Begin Patch\n+x = 1\n*** End Patch")
    primary = chat_response(None, finish="tool_calls", tool_calls=[primary_call])
    answer = chat_response(None, finish="tool_calls", tool_calls=[candidate])
    assert verdicts(primary, answer)["tool_calls"] is agree
    [call] = extract_answer(answer).tool_calls
    assert (call.name, call.arguments) == (
        candidate["custom"]["name"],
        candidate["custom"]["input"],
    )


def test_a_responses_custom_tool_call_is_a_tool_call() -> None:
    item = {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "+x"}
    answer = extract_answer({"object": "response", "output": [item]})
    assert [(c.name, c.arguments) for c in answer.tool_calls] == [("apply_patch", "+x")]
