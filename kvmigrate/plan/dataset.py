"""A plan's `--dataset`: JSONL without times, read into turns with token counts.

Three shapes:
- `kvmigrate report --export-requests` lines (`{"custom_id", "body", "metadata"}`): one
  request each, its conversation and turn in `metadata`, and, from an export of this
  version on, the record's own token counts in `metadata.usage`;
- bench conversations, OpenAI `messages` (each user message a turn, the next assistant
  message its answer) or ShareGPT `conversations`.

An answer's length is never a request's `max_tokens` (a cap, often 10 to 100 times the
answer). It is, in order: the recorded `usage.completion_tokens`; the answer itself, as
the conversation's next request (or the bench conversation) carries it in its history;
else `--output-tokens`, else the median of the answers the file does hold, else 256,
each capped at the request's `max_tokens`. The plan says how many answers came from where.

Prompt tokens, unless recorded, are counted at about four characters a token over
everything the chat template renders: message text, tool calls and their arguments, the
tool definitions and a response schema, plus a few tokens of role markers per message.
A field of the wrong type or out of range is an error naming the file, line and field.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from kvmigrate.datasets import jsonl_objects
from kvmigrate.plan.workload import (
    CHARS_PER_TOKEN,
    DEFAULT_OUTPUT_TOKENS,
    Turn,
    Workload,
    WorkloadError,
    assemble,
)

MAX_OUTPUT_TOKENS = 1_000_000  # no model answers more in one request; 1e11 is a typo
MAX_PROMPT_TOKENS = 10_000_000  # the longest context windows offered (10M)
CAP_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")  # chat, legacy, Responses
TEMPLATE_TOKENS = 4  # role markers a chat template adds per message
_SHAREGPT = {"human": "user", "user": "user", "system": "system", "gpt": "assistant"}


def chars_tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN)


def _json_chars(value: Any) -> int:
    return len(orjson.dumps(value)) if value else 0


def text_tokens(value: Any) -> int:
    """About how many tokens a message's content holds (text parts only)."""
    if isinstance(value, str):
        return chars_tokens(len(value))
    if isinstance(value, list):
        return sum(text_tokens(p.get("text", "")) for p in value if isinstance(p, dict))
    return 0


def message_tokens(message: Mapping[str, Any]) -> int:
    """A message as the template renders it: its text, its tool calls (name and arguments,
    as JSON) and the markers around it."""
    calls = message.get("tool_calls")
    return TEMPLATE_TOKENS + text_tokens(message.get("content")) + chars_tokens(_json_chars(calls))


def answer_tokens(message: Mapping[str, Any]) -> int:
    """An answer as the model generated it: its text, and each tool call as open models'
    templates have them write it (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`,
    the tags a token each; the call's id and type are the server's, not generated), and the
    end-of-sequence token."""
    calls = message.get("tool_calls")
    generated, tags = 0, 0
    for call in calls if isinstance(calls, list) else ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name") or "", function.get("arguments") or ""
            generated += len(f'{{"name": "{name}", "arguments": {arguments}}}')
            tags += 2
    return text_tokens(message.get("content")) + chars_tokens(generated) + tags + 1


def body_tokens(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> int:
    """A request's prompt: its messages and what the template adds for tools and schemas."""
    extra = _json_chars(body.get("tools")) + _json_chars(body.get("functions"))
    extra += _json_chars(body.get("response_format"))
    system = body.get("system")  # Anthropic Messages keep it outside the messages
    return sum(map(message_tokens, messages)) + chars_tokens(extra) + text_tokens(system)


class _Line:
    """Where a line came from, to name it and its field in an error."""

    def __init__(self, path: Path, number: int) -> None:
        self.path, self.number = path, number

    def error(self, field: str, problem: str) -> WorkloadError:
        return WorkloadError(f"{self.path}:{self.number}: {field} {problem}")

    def count(self, value: Any, field: str, low: int, high: int) -> int | None:
        """An optional whole number from `low` to `high`, or an error naming `field`."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(
                field, f"must be a whole number from {low:,} to {high:,}, got {value!r}"
            )
        return value

    def messages(self, value: Any, field: str) -> list[Mapping[str, Any]]:
        if not isinstance(value, list) or not value:
            raise self.error(field, "must be a non-empty list of messages")
        for i, message in enumerate(value):
            if not isinstance(message, dict):
                raise self.error(
                    f"{field}[{i}]", f"must be an object, got {type(message).__name__}"
                )
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                kind = type(content).__name__
                raise self.error(f"{field}[{i}].content", f"must be text or a list, got {kind}")
        return value


@dataclass(slots=True)
class _Request:
    """An --export-requests line, read."""

    conversation: str
    turn: int
    number: int
    messages: list[Mapping[str, Any]]
    prompt: int
    output: int | None  # the recorded answer's length; None until found
    cap: int | None  # max_tokens
    cached: int | None = None


def _export_line(line: _Line, data: dict[str, Any]) -> _Request:
    body, meta = data["body"], data.get("metadata") or {}
    if not isinstance(meta, dict):
        raise line.error("metadata", "must be an object")
    raw = body.get("messages") if "messages" in body else body.get("input")
    if isinstance(raw, str):  # a Responses API input of one text
        raw = [{"role": "user", "content": raw}]
    messages = line.messages(raw, "body.messages")
    caps = [k for k in CAP_KEYS if body.get(k) is not None]
    cap = line.count(body[caps[0]], f"body.{caps[0]}", 1, MAX_OUTPUT_TOKENS) if caps else None
    usage = meta.get("usage") or {}
    if not isinstance(usage, dict):
        raise line.error("metadata.usage", "must be an object")
    prompt = line.count(usage.get("prompt_tokens"), "metadata.usage.prompt_tokens", 1,
                        MAX_PROMPT_TOKENS)  # fmt: skip
    output = line.count(usage.get("completion_tokens"), "metadata.usage.completion_tokens", 0,
                        MAX_OUTPUT_TOKENS)  # fmt: skip
    cached = line.count(usage.get("cached_tokens"), "metadata.usage.cached_tokens", 0,
                        MAX_PROMPT_TOKENS)  # fmt: skip
    turn = line.count(meta.get("turn"), "metadata.turn", 1, 1_000_000) or 1
    conversation = meta.get("conversation") or data.get("custom_id") or line.number
    return _Request(
        str(conversation), turn, line.number, messages,
        prompt or body_tokens(body, messages), output, cap, cached,
    )  # fmt: skip


def _answers_from_history(requests: Sequence[_Request]) -> None:
    """Each turn's answer, where the conversation's next request carries it: the assistant
    message right after this turn's own messages."""
    by_conversation: dict[str, list[_Request]] = defaultdict(list)
    for r in requests:
        by_conversation[r.conversation].append(r)
    for turns in by_conversation.values():
        turns.sort(key=lambda r: (r.turn, r.number))
        for current, following in itertools.pairwise(turns):
            if current.output is not None or len(following.messages) <= len(current.messages):
                continue
            answer = following.messages[len(current.messages)]
            if answer.get("role") == "assistant":
                current.output = answer_tokens(answer)


def _lines(path: Path) -> Iterator[tuple[_Line, dict[str, Any]]]:
    for number, _, data in jsonl_objects(path):
        yield _Line(path, number), data


def _conversation(line: _Line, messages: list[Mapping[str, Any]]) -> list[Turn]:
    """A bench conversation: a turn per user message, answered by the next assistant one."""
    turns: list[Turn] = []
    history = 0
    for message in messages:
        tokens = message_tokens(message)
        if message.get("role") == "assistant" and turns:
            turns[-1].output = answer_tokens(message)
        history += tokens
        if message.get("role") == "user":
            turns.append(Turn(f"c{line.number}", len(turns) + 1, 0.0, history, -1))
    return turns


def _sharegpt(line: _Line, items: Any) -> list[Mapping[str, Any]]:
    if not isinstance(items, list):
        raise line.error("conversations", "must be a list")
    out: list[Mapping[str, Any]] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise line.error(f"conversations[{i}]", f"must be an object, got {type(item).__name__}")
        out.append(
            {"role": _SHAREGPT.get(str(item.get("from")), "user"), "content": item.get("value")}
        )
    return out


@dataclass(frozen=True, slots=True)
class Answers:
    """Where the answers' lengths came from, for the plan to say."""

    recorded: int = 0  # usage.completion_tokens, or the answer in the history
    assumed: int = 0  # none recorded: `assumed_tokens` each (capped at max_tokens)
    assumed_tokens: int = DEFAULT_OUTPUT_TOKENS
    assumed_from: str = "the default"

    def note(self) -> str:
        total = self.recorded + self.assumed
        text = f"Answer lengths: {self.recorded:,} of {total:,} from the recorded answers"
        if self.assumed:
            text += (
                f"; {self.assumed:,} unrecorded took {self.assumed_tokens:,} tokens "
                f"({self.assumed_from}), capped at their max_tokens"
            )
        return text + "; a request's max_tokens is never taken as its answer's length."


def _fill(turns: list[Turn], caps: Sequence[int | None], output_tokens: int | None) -> Answers:
    """Give each turn without a recorded answer (output -1) the assumed length."""
    known = [t.output for t in turns if t.output >= 0]
    if output_tokens is not None:
        assumed, source = output_tokens, "--output-tokens"
    elif known:
        assumed, source = max(1, round(statistics.median(known))), "the median recorded answer"
    else:
        assumed, source = DEFAULT_OUTPUT_TOKENS, "the default; set --output-tokens"
    missing = 0
    for turn, cap in zip(turns, caps, strict=True):
        if turn.output < 0:
            missing += 1
            turn.output = assumed if cap is None else min(assumed, cap)
    return Answers(len(turns) - missing, missing, assumed, source)


def from_jsonl(path: Path, output_tokens: int | None = None) -> Workload:
    """Export or bench JSONL; arrival times are all zero until `pace` spreads them."""
    requests: list[_Request] = []
    turns: list[Turn] = []
    for line, data in _lines(path):
        if isinstance(data.get("body"), dict):
            requests.append(_export_line(line, data))
        elif "messages" in data:
            turns.extend(_conversation(line, line.messages(data["messages"], "messages")))
        elif "conversations" in data:
            turns.extend(_conversation(line, _sharegpt(line, data["conversations"])))
        else:
            raise line.error(
                "the line", "is neither an --export-requests line, OpenAI messages nor ShareGPT"
            )
    _answers_from_history(requests)
    caps: list[int | None] = [None] * len(turns)
    for r in requests:
        output = -1 if r.output is None else r.output
        turns.append(
            Turn(r.conversation, r.turn, float(r.number), r.prompt, output, cached=r.cached)
        )
        caps.append(r.cap)
    answers = _fill(turns, caps, output_tokens)
    workload = assemble(turns, str(path))
    # Its "times" were line numbers: it has no recording window.
    return replace(workload, basis_s=0.0, notes=(answers.note(),), window=None)
