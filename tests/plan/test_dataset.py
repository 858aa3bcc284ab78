"""A plan's --dataset: token counts, answer lengths from the recorded answers (never from
max_tokens), and a named error for each malformed field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from kvmigrate.datasets import DatasetError
from kvmigrate.plan.dataset import from_jsonl
from kvmigrate.plan.workload import WorkloadError


def write(tmp_path: Path, *lines: Any) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def tokens(chars: int) -> int:
    """A message of `chars` characters: 4 template tokens and a token per 4 characters."""
    return 4 + math.ceil(chars / 4)


def export(turn: int, messages: list[dict[str, Any]], **body: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"conversation": "conv", "turn": turn}
    if "usage" in body:
        meta["usage"] = body.pop("usage")
    return {"custom_id": f"r{turn}", "body": {"messages": messages, **body}, "metadata": meta}


def generated(chars: int) -> int:
    """An answer of `chars` characters of text: a token per 4, and the end-of-sequence."""
    return math.ceil(chars / 4) + 1


def user(chars: int) -> dict[str, str]:
    return {"role": "user", "content": "u" * chars}


def assistant(chars: int) -> dict[str, str]:
    return {"role": "assistant", "content": "a" * chars}


def outputs(path: Path, **options: Any) -> dict[tuple[str, int], tuple[int, int]]:
    workload = from_jsonl(path, **options)
    return {(r.conversation, r.turn): (r.prompt_tokens, r.output_tokens) for r in workload.requests}


def test_the_three_shapes_count_tokens_and_turns(tmp_path: Path) -> None:
    bench = {"messages": [{"role": "system", "content": "s" * 40}, user(80), assistant(120),
                          user(40)]}  # fmt: skip
    sharegpt = {"conversations": [{"from": "human", "value": "h" * 8}]}
    path = write(tmp_path, export(2, [user(400)], max_tokens=64), bench, sharegpt)
    got = outputs(path)
    answer = generated(120)  # the only answer the file holds: the unknown ones take it
    assert got[("conv", 2)] == (tokens(400), answer)
    assert got[("c2", 1)] == (tokens(40) + tokens(80), answer)
    # In the next prompt the answer is a message: its text and the template's markers.
    assert got[("c2", 2)] == (tokens(40) + tokens(80) + tokens(120) + tokens(40), answer)
    assert got[("c3", 1)] == (tokens(8), answer)


@pytest.mark.parametrize("cap", [None, 256, 1024, 8192])
def test_an_answer_s_length_is_the_recorded_answer_whatever_the_cap(
    tmp_path: Path, cap: int | None
) -> None:
    """The issue's case: the same requests gave 1 or 2 replicas by their max_tokens alone."""
    capped = {} if cap is None else {"max_tokens": cap}
    first = [user(100)]
    second = [*first, assistant(60), user(20)]
    third = [*second, assistant(100), user(20)]
    path = write(
        tmp_path,
        export(1, first, **capped),  # answered in turn 2's history: 60 characters
        export(2, second, usage={"completion_tokens": 31}, **capped),  # recorded: 31
        export(3, third, **capped),  # no answer anywhere: the median of the known ones
    )
    got = outputs(path)
    known = [generated(60), 31]
    assert [got[("conv", t)][1] for t in (1, 2, 3)] == [*known, round(sum(known) / 2)]
    note = from_jsonl(path).notes[0]
    assert note.startswith("Answer lengths: 2 of 3 from the recorded answers; 1 unrecorded took")
    assert "(the median recorded answer)" in note


def test_output_tokens_option_fills_unknown_answers_capped_at_max_tokens(tmp_path: Path) -> None:
    path = write(tmp_path, export(1, [user(10)], max_tokens=50), export(2, [user(999)]))
    got = outputs(path, output_tokens=200)
    assert got[("conv", 1)][1] == 50  # the cap bounds an assumed answer, never sets one
    assert got[("conv", 2)][1] == 200
    assert "took 200 tokens (--output-tokens)" in from_jsonl(path, output_tokens=200).notes[0]


def test_tools_tool_calls_and_schemas_count_in_the_prompt(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
    calls = [{"id": "1", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]
    messages = [user(40), {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "1", "content": "t" * 12}]  # fmt: skip
    schema = {"type": "json_object"}
    path = write(tmp_path, export(1, messages, tools=tools, response_format=schema))
    compact = {"separators": (",", ":")}
    calls_tokens = 4 + math.ceil(len(json.dumps(calls, **compact)) / 4)  # type: ignore[arg-type]
    extra = len(json.dumps(tools, **compact)) + len(json.dumps(schema, **compact))  # type: ignore[arg-type]
    assert outputs(path)[("conv", 1)][0] == tokens(40) + calls_tokens + tokens(12) + math.ceil(
        extra / 4
    )


def test_a_tool_call_answer_counts_what_the_model_writes(tmp_path: Path) -> None:
    """`<tool_call>{"name": "grep", "arguments": {"q": "x"}}</tool_call>`: the tags a token
    each, the JSON between them at 4 characters a token, and the end of sequence."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "grep", "arguments": '{"q": "x"}'}}  # fmt: skip
    answer = {"role": "assistant", "content": None, "tool_calls": [call]}
    path = write(tmp_path, export(1, [user(8)]), export(2, [user(8), answer, user(4)]))
    written = '{"name": "grep", "arguments": {"q": "x"}}'
    assert outputs(path)[("conv", 1)][1] == 2 + math.ceil(len(written) / 4) + 1


def test_recorded_prompt_tokens_win_over_counting(tmp_path: Path) -> None:
    path = write(tmp_path, export(1, [user(40)], usage={"prompt_tokens": 1234, "cached_tokens": 4}))
    (request,) = from_jsonl(path).requests
    assert request.prompt_tokens == 1234
    assert request.recorded_cached_tokens == 4


OK = {"messages": [{"role": "user", "content": "ok"}]}
BAD_LINES = {
    "max_tokens as text": (export(1, [user(1)], max_tokens="100"), "body.max_tokens must be a whole number from 1 to 1,000,000, got '100'"),
    "max_tokens 1e11": (export(1, [user(1)], max_tokens=1e11), "body.max_tokens must be a whole number from 1 to 1,000,000, got 100000000000.0"),
    "max_tokens huge": (export(1, [user(1)], max_tokens=10**11), "body.max_tokens must be a whole number from 1 to 1,000,000, got 100000000000"),
    "max_tokens 0": (export(1, [user(1)], max_tokens=0), "body.max_tokens must be a whole number from 1 to 1,000,000, got 0"),
    "max_tokens bool": (export(1, [user(1)], max_tokens=True), "body.max_tokens must be a whole number from 1 to 1,000,000, got True"),
    "turn as text": ({**export(1, [user(1)]), "metadata": {"turn": "2"}}, "metadata.turn must be a whole number from 1 to 1,000,000, got '2'"),
    "turn negative": ({**export(1, [user(1)]), "metadata": {"turn": -1}}, "metadata.turn must be a whole number from 1 to 1,000,000, got -1"),
    "metadata a list": ({**export(1, [user(1)]), "metadata": [1]}, "metadata must be an object"),
    "usage as text": (export(1, [user(1)], usage={"completion_tokens": "9"}), "metadata.usage.completion_tokens must be a whole number from 0 to 1,000,000, got '9'"),
    "a message not an object": (export(1, [user(1), "hi"]), "body.messages[1] must be an object, got str"),
    "content a number": (export(1, [{"role": "user", "content": 5}]), "body.messages[0].content must be text or a list, got int"),
    "no messages": ({"body": {"messages": []}}, "body.messages must be a non-empty list of messages"),
    "bench message not an object": ({"messages": [None]}, "messages[0] must be an object, got NoneType"),
    "sharegpt item not an object": ({"conversations": [3]}, "conversations[0] must be an object, got int"),
    "unknown shape": ({"prompt": "x"}, "the line is neither an --export-requests line, OpenAI messages nor ShareGPT"),
}  # fmt: skip


@pytest.mark.parametrize(("line", "message"), BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_malformed_field_is_named_with_its_file_and_line(
    tmp_path: Path, line: Any, message: str
) -> None:
    path = write(tmp_path, OK, line)
    with pytest.raises(WorkloadError) as caught:
        from_jsonl(path)
    assert str(caught.value) == f"{path}:2: {message}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [("not json", "not valid JSON"), ("[1, 2]", "expected a JSON object, got a list")],
)
def test_a_line_that_is_no_object_is_named(tmp_path: Path, raw: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(OK) + "\n" + raw + "\n")
    with pytest.raises(DatasetError, match=rf"bad.jsonl:2: {message}"):
        from_jsonl(path)
