"""Conversation identity from continuity and from the masked opening: the pure parts."""

from __future__ import annotations

import json
from typing import Any

from kvmigrate.policies.continuity import answer_digest, iter_answer, request_history
from kvmigrate.policies.conversation import conversation_key
from kvmigrate.policies.volatile import mask_volatile


def link_of(route: str, request: dict[str, Any], response: dict[str, Any]) -> str:
    history = request_history(route, request)
    assert history is not None
    return answer_digest(history.hasher, list(iter_answer(route, response)))


def lookup_of(route: str, request: dict[str, Any]) -> str | None:
    history = request_history(route, request)
    assert history is not None
    return history.lookup


def chat_response(message: dict[str, Any]) -> dict[str, Any]:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}


def system(now: str) -> dict[str, Any]:
    return {"role": "system", "content": f"You are a travel agent.\nCurrent time: {now}"}


def test_a_changing_system_prompt_does_not_hide_the_previous_turn() -> None:
    first = {"messages": [system("2026-12-01 10:00:01"), {"role": "user", "content": "Rome?"}]}
    answer = {"role": "assistant", "content": "Rome is lovely in May."}
    link = link_of("chat/completions", first, chat_response(answer))
    # What the openai SDK resends for `messages.append(completion.choices[0].message)`: the
    # fields the server sent (exclude_unset), refusal and annotations included.
    resent = {**answer, "refusal": None, "annotations": [], "tool_calls": None}
    second = {
        "messages": [
            system("2026-12-01 10:03:59"),
            {"role": "user", "content": [{"type": "text", "text": "Rome?"}]},
            resent,
            {"role": "user", "content": "And Paris?"},
        ]
    }
    assert lookup_of("chat/completions", second) == link
    edited = json.loads(json.dumps(second))
    edited["messages"][2]["content"] = "Rome is lovely in June."
    assert lookup_of("chat/completions", edited) != link


def test_a_first_turn_has_nothing_to_look_up() -> None:
    history = request_history("chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert history is not None
    assert history.lookup is None
    assert history.turn == 1


def test_tool_results_are_new_and_reserialised_arguments_still_match() -> None:
    first = {"messages": [system("t1"), {"role": "user", "content": "Weather in Rome?"}]}
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Rome", "unit": "C"}'},
    }
    answer = {"role": "assistant", "content": None, "tool_calls": [call]}
    link = link_of("chat/completions", first, chat_response(answer))
    # A dict-based agent that parsed the arguments and dumped them again, and sends "" content.
    redumped = {**call, "function": {"name": "weather", "arguments": '{"unit":"C","city":"Rome"}'}}
    second = {
        "messages": [
            system("t2"),
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": "", "tool_calls": [redumped]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21C, sunny"},
        ]
    }
    assert lookup_of("chat/completions", second) == link
    history = request_history("chat/completions", second)
    assert history is not None
    assert history.turn == 2


def test_responses_stateless_input_continues_from_its_output_items() -> None:
    first = {"instructions": "Now: 10:00:01", "input": "Weather in Rome?"}
    output = [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": '{"city":"Rome"}',
        },
    ]
    link = link_of("responses", first, {"object": "response", "output": output})
    second = {
        "instructions": "Now: 10:00:09",
        "input": [
            {"role": "user", "content": "Weather in Rome?"},
            output[1],  # the reasoning item not resent
            {"type": "function_call_output", "call_id": "c1", "output": "21C"},
        ],
    }
    assert lookup_of("responses", second) == link
    chained = {"previous_response_id": "resp_1", "input": "more"}
    assert request_history("responses", chained) is None  # a stored chain is issue 17's


def test_anthropic_messages_continue_through_tool_use_and_tool_result() -> None:
    first = {"system": "Now: 10:00", "messages": [{"role": "user", "content": "Weather?"}]}
    content = [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "tu_1", "name": "weather", "input": {"city": "Rome"}},
    ]
    link = link_of("messages", first, {"type": "message", "content": content})
    second = {
        "system": "Now: 10:01",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "tu_1", "content": "21C"}],
            },
        ],
    }
    assert lookup_of("messages", second) == link


def test_two_conversations_sharing_an_opening_leave_different_links() -> None:
    opening = {"messages": [system("t"), {"role": "user", "content": "Tell me a story"}]}
    a = link_of("chat/completions", opening, chat_response({"role": "assistant", "content": "A"}))
    b = link_of("chat/completions", opening, chat_response({"role": "assistant", "content": "B"}))
    assert a != b


def test_volatile_spans_are_masked_and_plain_numbers_kept() -> None:
    text = (
        "Today is Monday, January 6, 2025 10:31.\n"
        "trace 550e8400-e29b-41d4-a716-446655440000 req_8f3a9c2b11 at 1733065226\n"
        "What is 2+2?"
    )
    masked = mask_volatile(text)
    for value in ("January 6", "10:31", "550e8400", "req_8f3a9c2b11", "1733065226"):
        assert value not in masked
    assert masked.endswith("What is 2+2?")
    assert mask_volatile("no digits here") == "no digits here"
    assert mask_volatile("Zeit: 2025-01-06 10:31 ü") == mask_volatile("Zeit: 2025-02-07 11:45 ü")


def test_the_opening_key_ignores_timestamps_and_ids_but_not_the_question() -> None:
    def key(now: str, question: str) -> str:
        body = {"messages": [system(now), {"role": "user", "content": question}]}
        return conversation_key({}, body, "m").value

    assert key("2026-12-01T10:00:01Z", "Rome?") == key("2026-12-02T23:59:59Z", "Rome?")
    assert key("2026-12-01T10:00:01Z", "Rome?") != key("2026-12-01T10:00:01Z", "Paris?")


def test_the_next_turn_names_this_request_even_before_its_answer_is_linked() -> None:
    first = {"messages": [system("t1"), {"role": "user", "content": "Rome?"}]}
    second = {
        "messages": [
            system("t2"),
            {"role": "user", "content": "Rome?"},
            {"role": "assistant", "content": "Lovely in May."},
            {"role": "user", "content": "Paris?"},
        ]
    }
    asked_first = request_history("chat/completions", first)
    asked_second = request_history("chat/completions", second)
    assert asked_first is not None
    assert asked_second is not None
    assert asked_second.asked == asked_first.request_link
    assert asked_second.lookup != asked_second.asked
