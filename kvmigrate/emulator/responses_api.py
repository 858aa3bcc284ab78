"""The OpenAI Responses API (`POST /v1/responses`): requests mapped onto the chat pipeline,
answers as `response` objects, and streams as typed events with sequence numbers (no
`[DONE]`). Minimal but correct in shape: text and function-call output items, usage with
cached tokens, `incomplete` when `max_output_tokens` cuts the answer. `previous_response_id`
continues a response this backend stored (kvmigrate.emulator.response_store).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvmigrate.emulator.errors import bad_request
from kvmigrate.emulator.outputs import Choice, Generation
from kvmigrate.emulator.parsing import (
    GenerationRequest,
    last_user_text,
    parse_tools,
    require_model,
    require_object,
    response_format,
    tool_policy,
)
from kvmigrate.emulator.tokens import content_text, render_chat
from kvmigrate.emulator.wire import JSON, Dialect, Step

_ECHOED = ("instructions", "metadata", "previous_response_id", "tool_choice", "user")


# Input items that carry nothing the emulated model reads: a reasoning model's reasoning
# (which stateless agents send back each turn, its content encrypted) is accepted, as the
# hosted API and vLLM accept it, and left out of the prompt.
_SILENT_ITEMS = frozenset({"reasoning"})


def _item_message(item: JSON) -> JSON:
    kind = item.get("type", "message")
    if kind == "message":
        return {"role": str(item.get("role", "user")), "content": content_text(item.get("content"))}
    if kind == "function_call":
        call = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
        return {"role": "assistant", "content": None, "tool_calls": [{"function": call}]}
    if kind == "function_call_output":
        return {"role": "tool", "content": str(item.get("output", ""))}
    raise bad_request(f"Invalid input item type {kind!r}.", "input")


def to_messages(body: JSON, previous: Sequence[JSON] = ()) -> list[JSON]:
    """The request as chat messages: its instructions (which a continued response does not
    inherit), the stored conversation it continues, then its own input."""
    messages: list[JSON] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(previous)
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and all(isinstance(i, dict) for i in raw):
        messages.extend(_item_message(i) for i in raw if i.get("type") not in _SILENT_ITEMS)
    else:
        raise bad_request("Invalid 'input': expected a string or an array of items.", "input")
    if not messages:
        raise bad_request("Invalid 'input': empty.", "input")
    return messages


def _temperature(body: JSON) -> float | None:
    value = body.get("temperature")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def parse_responses(
    raw: Any, stored: Callable[[str], list[JSON]] | None = None
) -> tuple[GenerationRequest, JSON, list[JSON]]:
    """The generation request, the request fields a response object echoes, and the
    conversation so far (less instructions) that the answer's stored copy extends."""
    body = require_object(raw)
    model = require_model(body)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        # Ignoring it would answer without the history the client meant to continue.
        message = "Invalid type for 'previous_response_id': expected a string."
        raise bad_request(message, "previous_response_id", "invalid_type")
    history = stored(previous) if stored is not None and previous is not None else []
    messages = to_messages(body, history)
    tools = parse_tools(body.get("tools"), flat=True)
    text = body.get("text")
    json_mode, schema = response_format(text.get("format") if isinstance(text, dict) else None)
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 16):
        message = "Invalid 'max_output_tokens': integer below minimum value (16)."
        raise bad_request(message, "max_output_tokens", "integer_below_min_value")
    chat_tools = [{"type": "function", "function": {"name": t.name}} for t in tools]
    request = GenerationRequest(
        model=model,
        prompt=render_chat(messages, chat_tools),
        topic_text=last_user_text(messages),
        last_role=str(messages[-1]["role"]),
        stream=body.get("stream") is True,
        max_tokens=max_tokens,
        temperature=_temperature(body),
        tools=tool_policy(body, tools, flat=True),
        json_mode=json_mode,
        json_schema=schema,
    )
    echo = {key: body.get(key) for key in _ECHOED}
    echo.update(
        max_output_tokens=max_tokens,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        temperature=body.get("temperature", 1.0),
        top_p=body.get("top_p", 1.0),
        tools=body.get("tools") or [],
        tool_choice=body.get("tool_choice", "auto"),
        text=text if isinstance(text, dict) else {"format": {"type": "text"}},
        store=body.get("store", True),
        metadata=body.get("metadata") or {},
    )
    conversation = messages[1:] if isinstance(body.get("instructions"), str) else messages
    return request, echo, conversation


class ResponseRenderer:
    """Builds one response's items and events; ids are fixed once, shared by both forms."""

    def __init__(self, gen: Generation, echo: JSON, dialect: Dialect) -> None:
        self.gen = gen
        self.choice: Choice = gen.choices[0]
        self.echo = echo
        self.id = f"resp_{dialect.hex(48)}"
        self.message_id = f"msg_{dialect.hex(48)}"
        self.call_ids = [f"fc_{dialect.hex(48)}" for _ in self.choice.tool_calls]
        self._sequence = 0

    @property
    def incomplete(self) -> bool:
        return self.choice.finish_reason == "length"

    def _text_part(self, text: str) -> JSON:
        return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}

    def _message_item(self, done: bool) -> JSON:
        return {
            "id": self.message_id,
            "type": "message",
            "status": ("incomplete" if self.incomplete else "completed") if done else "in_progress",
            "content": [self._text_part(self.choice.text)] if done else [],
            "role": "assistant",
        }

    def _call_item(self, position: int, done: bool) -> JSON:
        call = self.choice.tool_calls[position]
        return {
            "id": self.call_ids[position],
            "type": "function_call",
            "status": "completed" if done else "in_progress",
            "arguments": call.arguments if done else "",
            "call_id": call.id,
            "name": call.name,
        }

    def as_messages(self) -> list[JSON]:
        """The answer as the chat messages a continued response resends."""
        if not self.choice.tool_calls:
            return [{"role": "assistant", "content": self.choice.text}]
        calls = [
            {"function": {"name": c.name, "arguments": c.arguments}} for c in self.choice.tool_calls
        ]
        return [{"role": "assistant", "content": None, "tool_calls": calls}]

    def output(self) -> list[JSON]:
        if self.choice.tool_calls:
            return [self._call_item(i, True) for i in range(len(self.choice.tool_calls))]
        return [self._message_item(True)]

    def response(self, status: str) -> JSON:
        finished = status != "in_progress"
        usage = {
            "input_tokens": self.gen.prompt_tokens,
            "input_tokens_details": {"cached_tokens": self.gen.cached_tokens},
            "output_tokens": self.gen.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.gen.prompt_tokens + self.gen.completion_tokens,
        }
        details = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.gen.created,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": details,
            "model": self.gen.model,
            "output": self.output() if finished else [],
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "truncation": "disabled",
            "usage": usage if finished else None,
            **self.echo,
        }

    def final_status(self) -> str:
        return "incomplete" if self.incomplete else "completed"

    def _event(self, kind: str, **fields: Any) -> JSON:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def events(self) -> Iterator[Step]:
        yield [self._event("response.created", response=self.response("in_progress"))], False
        yield [self._event("response.in_progress", response=self.response("in_progress"))], False
        if self.choice.tool_calls:
            for position in range(len(self.choice.tool_calls)):
                yield from self._call_events(position)
        else:
            yield from self._text_events()
        final = self.final_status()
        yield [self._event(f"response.{final}", response=self.response(final))], False

    def _text_events(self) -> Iterator[Step]:
        ids = {"item_id": self.message_id, "output_index": 0}
        added = self._event(
            "response.output_item.added", output_index=0, item=self._message_item(False)
        )
        yield [added], False
        part = self._text_part("")
        yield [self._event("response.content_part.added", **ids, content_index=0, part=part)], False
        for piece in self.choice.pieces:
            delta = self._event(
                "response.output_text.delta", **ids, content_index=0, delta=piece, logprobs=[]
            )
            yield [delta], True
        text = self.choice.text
        done = self._event(
            "response.output_text.done", **ids, content_index=0, text=text, logprobs=[]
        )
        part_done = self._event(
            "response.content_part.done", **ids, content_index=0, part=self._text_part(text)
        )
        item_done = self._event(
            "response.output_item.done", output_index=0, item=self._message_item(True)
        )
        yield [done, part_done, item_done], False

    def _call_events(self, position: int) -> Iterator[Step]:
        ids = {"item_id": self.call_ids[position], "output_index": position}
        item = self._call_item(position, False)
        yield [self._event("response.output_item.added", output_index=position, item=item)], True
        for piece in self.choice.argument_pieces[position]:
            event = self._event("response.function_call_arguments.delta", **ids, delta=piece)
            yield [event], True
        arguments = self.choice.tool_calls[position].arguments
        done = self._event("response.function_call_arguments.done", **ids, arguments=arguments)
        item_done = self._event(
            "response.output_item.done", output_index=position, item=self._call_item(position, True)
        )
        yield [done, item_done], False
