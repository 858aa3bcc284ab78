"""Responses API chain identity, the pure parts (issue 17): what a request continues, where
a continued chain is routed, how a stateless request is keyed and its turns counted, the
splice of a copy's `previous_response_id`, and reading an answer's id."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from kvmigrate.policies import RolloutSnapshot, route
from kvmigrate.policies.chain import ChainEntry, ChainRef, chain_ref, stick, unknown_chain
from kvmigrate.policies.conversation import conversation_key, turn_index
from kvmigrate.policies.route import Route
from kvmigrate.proxy.body import with_previous_response
from kvmigrate.wire.response_id import response_id

SERVED = {"hosted": "gpt-4o-mini", "vllm": "llama"}


def snapshot(mode: str = "split", percent: float = 50) -> RolloutSnapshot:
    return RolloutSnapshot("hosted", "vllm", mode, percent, 1.0, "salt")


@pytest.mark.parametrize(
    ("body", "ref"),
    [
        ({"input": "hi"}, None),
        ({"input": "hi", "previous_response_id": ""}, None),
        ({"previous_response_id": "resp_1"}, ChainRef("resp_1", None)),
        ({"conversation": "conv_1"}, ChainRef(None, "conv_1")),
        ({"conversation": {"id": "conv_1"}}, ChainRef(None, "conv_1")),
        ({"conversation": {"id": 7}}, None),
    ],
)
def test_chain_ref(body: dict[str, Any], ref: ChainRef | None) -> None:
    assert chain_ref(body) == ref


def test_chain_ref_keys() -> None:
    assert ChainRef("resp_1", None).key == "r:resp_1"
    assert ChainRef(None, "conv_1").key == "v:conv_1"
    assert ChainRef(None, "conv_1").conversation_key == "conv:conv_1"
    assert ChainRef("resp_1", None).conversation_key is None


@pytest.mark.parametrize(
    ("ref", "conversation"),
    [
        (
            ChainRef("resp_67ccd2bed1ec8190b14f964abc05", None),
            "resp:resp_67ccd2bed1ec8190b14f964abc05",
        ),
        (ChainRef("resp_1", "conv_1"), "conv:conv_1"),
        (ChainRef(None, "conv_1"), "conv:conv_1"),
    ],
)
def test_an_unknown_chain_s_conversation_is_named_for_its_id(
    ref: ChainRef, conversation: str
) -> None:
    assert ref.guessed_conversation == conversation


@pytest.mark.parametrize(
    "sent",
    ["resp_jane.doe@example.com_555-123-4567", "resp_" + "x" * 200_000, "conv_\n1", "résp"],
)
def test_an_id_no_api_mints_is_not_kept_verbatim_in_the_conversation(sent: str) -> None:
    for ref, prefix in ((ChainRef(sent, None), "resp:h"), (ChainRef(None, sent), "conv:h")):
        key = ref.guessed_conversation
        assert key.startswith(prefix)
        assert len(key) == len(prefix) + 24
        assert sent not in key
    assert (
        ChainRef(sent + "2", None).guessed_conversation != ChainRef(sent, None).guessed_conversation
    )


@pytest.mark.parametrize("percent", [0, 50, 100])
@pytest.mark.parametrize("backend", ["hosted", "vllm"])
def test_a_chain_goes_where_it_is_stored_whatever_the_split_says(
    percent: float, backend: str
) -> None:
    for number in range(40):
        routed = stick(route(f"c{number}", snapshot(percent=percent), SERVED), backend)
        assert routed.serve == backend
        assert routed.fallback is None  # no other backend holds the chain
        assert routed.shadow in ((None, "vllm") if backend == "hosted" else (None,))


def test_a_chain_on_the_primary_keeps_its_shadow_copy_in_shadow_mode() -> None:
    routed = stick(route("c", snapshot("shadow", 0), SERVED), "hosted")
    assert routed.shadow == "vllm"


def test_an_unknown_chain_goes_to_the_primary_when_it_serves_the_model() -> None:
    for number in range(40):
        routed = unknown_chain(route(f"c{number}", snapshot(percent=100), SERVED), SERVED)
        assert (routed.serve, routed.fallback) == ("hosted", None)
    only_candidate = {"vllm": "llama"}
    routed = unknown_chain(route("c", snapshot(), only_candidate), only_candidate)
    assert routed.serve == "vllm"


def test_string_input_is_keyed_with_its_instructions_not_by_them_alone() -> None:
    keys = {
        conversation_key({}, {"instructions": "Be brief.", "input": f"question {n}"}, "m").value
        for n in range(8)
    }
    assert len(keys) == 8
    same = [{"instructions": "Be brief.", "input": "q"}] * 2
    assert len({conversation_key({}, body, "m").value for body in same}) == 1


def test_a_stateless_input_list_is_keyed_by_instructions_and_first_user_item() -> None:
    first = {"role": "user", "content": "Plan my trip"}
    turn1 = {"instructions": "Be brief.", "input": [first]}
    turn3 = {
        "instructions": "Be brief.",
        "input": [
            first,
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
            {"type": "message", "role": "assistant", "content": "Done."},
            {"role": "user", "content": "And then?"},
        ],
    }
    keys = {conversation_key({}, body, "m").value for body in (turn1, turn3)}
    assert len(keys) == 1


@pytest.mark.parametrize(
    ("items", "turn"),
    [
        ([{"role": "user", "content": "a"}], 1),
        ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], 2),
        (
            [
                {"role": "user", "content": "a"},
                {"type": "reasoning", "summary": []},
                {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "1"},
                {"type": "function_call_output", "call_id": "1", "output": "x"},
                {"type": "message", "role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
                {"role": "assistant", "content": "d"},
                {"role": "user", "content": "e"},
            ],
            4,
        ),
        # An input that opens with an answer (the history trimmed to after the first
        # question) still counts it.
        ([{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], 2),
        # An item that is not an object ends a run of output items: two answers either side.
        (
            [
                {"role": "assistant", "content": "b"},
                "junk",
                {"role": "assistant", "content": "d"},
                {"role": "user", "content": "e"},
            ],
            3,
        ),
        ("a string", 1),
    ],
)
def test_turn_index_counts_the_answers_a_responses_input_resends(items: Any, turn: int) -> None:
    assert turn_index({"input": items}) == turn


def test_the_copy_names_the_candidates_own_response_by_a_splice() -> None:
    raw = b'{"model": "m", "previous_response_id": "resp_A", "input": "x \\"previous\\""}'
    assert with_previous_response(raw, "resp_B") == raw.replace(b"resp_A", b"resp_B")


def test_a_nested_previous_response_id_is_left_alone() -> None:
    raw = b'{"metadata": {"previous_response_id": "keep"}, "previous_response_id": "resp_A"}'
    out = orjson.loads(with_previous_response(raw, "resp_B"))
    assert out == {"metadata": {"previous_response_id": "keep"}, "previous_response_id": "resp_B"}


def test_an_escaped_key_is_re_encoded_not_missed() -> None:
    raw = b'{"previous_response_id": "resp_A", "input": "\\u00e9"}'
    assert orjson.loads(with_previous_response(raw, "resp_B"))["previous_response_id"] == "resp_B"


def test_response_id_of_a_whole_answer_and_of_a_stream_cut_anywhere() -> None:
    assert response_id([b'{"id": "resp_1", "object": "response"}']) == "resp_1"
    stream = (
        b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_2"}}'
        b'\n\nevent: response.completed\ndata: {"type":"response.completed",'
        b'"response":{"id":"resp_2"}}\n\n'
    )
    for cut in range(1, len(stream)):
        assert response_id([stream[:cut], stream[cut:]]) == "resp_2"


@pytest.mark.parametrize(
    "chunks",
    [[b""], [b"not json"], [b'{"error": {"message": "x"}}'], [b"data: [DONE]\n\n"], [b"[1]"]],
)
def test_response_id_of_no_response_is_none(chunks: list[bytes]) -> None:
    assert response_id(chunks) is None


@pytest.mark.parametrize("backend", ["hosted", "vllm"])
def test_a_chain_sticks_to_its_backend_unpinned_and_without_a_fallback(backend: str) -> None:
    shot = snapshot("split", 100 if backend == "vllm" else 0)
    routed = Route(shot, serve=backend, shadow="x", fallback="y", noise=True, pin=True)
    assert stick(routed, backend) == Route(shot, backend, shadow="x", noise=True)
    other = "hosted" if backend == "vllm" else "vllm"
    assert stick(routed, other) == Route(shot, serve=other)  # moved: no copy, no pin


def test_each_candidate_continues_its_own_shadowed_chain() -> None:
    entry = ChainEntry("c", 2, "hosted", shadow_id="resp_one")
    assert (entry.shadow_id_for(""), entry.shadow_id_for("vllm")) == ("resp_one", "")
    two = entry.with_shadow_id("vllm", "resp_v1").with_shadow_id("sglang", "resp_s1")
    assert two.shadow_ids == (("vllm", "resp_v1"), ("sglang", "resp_s1"))
    assert (two.shadow_id_for("vllm"), two.shadow_id_for("sglang"), two.shadow_id_for("")) == (
        "resp_v1",
        "resp_s1",
        "resp_one",  # the one-candidate id is kept
    )
    moved = two.with_shadow_id("vllm", "resp_v2")  # a later turn replaces that candidate's id
    assert moved.shadow_ids == (("sglang", "resp_s1"), ("vllm", "resp_v2"))
    assert entry.with_shadow_id("", "resp_two") == ChainEntry(
        "c", 2, "hosted", shadow_id="resp_two"
    )
