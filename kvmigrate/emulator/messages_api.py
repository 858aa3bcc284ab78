"""Anthropic Messages answers, whole and streamed, as two servers write them.

- `anthropic` (the hosted API): usage with `cache_creation_input_tokens`,
  `cache_read_input_tokens`, `cache_creation` and `service_tier`; a `ping` after the first
  `content_block_start`; `message_delta` carries only `output_tokens`.
- `vllm` (0.32, vllm/entrypoints/anthropic/serving.py): `chatcmpl-` ids, null fields left
  out of whole answers, no ping, every count again in `message_delta`, and cache fields only
  with `--enable-prompt-tokens-details` (`cache_creation_input_tokens` from vLLM's
  `created_cache_tokens`: the whole blocks this prompt added to the cache).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

from kvmigrate.emulator.outputs import Choice, Generation
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.wire import JSON, Step

Flavor = Literal["anthropic", "vllm"]


def stop_reason(choice: Choice) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the OpenAI-style finish reason."""
    if choice.finish_reason == "length":
        return "max_tokens", None
    if choice.tool_calls:
        return "tool_use", None
    if choice.stop_reason is not None:
        return "stop_sequence", choice.stop_reason
    return "end_turn", None


def _tool_input(arguments: str) -> object:
    try:
        return json.loads(arguments)
    except ValueError:
        return {}  # a broken call (settings.broken_tool_calls): its name still shows it


class MessagesRenderer:
    def __init__(self, gen: Generation, settings: EmulatorSettings) -> None:
        self.gen = gen
        self.choice = gen.choices[0]
        self.flavor: Flavor = "anthropic" if settings.profile == "anthropic" else "vllm"
        self.details = settings.prompt_tokens_details
        self.block_size = settings.block_size

    def usage(self, output_tokens: int) -> JSON:
        gen = self.gen
        if self.flavor == "anthropic":
            written, read = gen.cache_written, gen.cached_tokens
            return {
                "input_tokens": gen.prompt_tokens - written - read,
                "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read,
                "cache_creation": {
                    "ephemeral_5m_input_tokens": written,
                    "ephemeral_1h_input_tokens": 0,
                },
                "output_tokens": output_tokens,
                "service_tier": "standard",
            }
        if not self.details:
            return {"input_tokens": gen.prompt_tokens, "output_tokens": output_tokens}
        whole = gen.prompt_tokens // self.block_size * self.block_size
        created = max(whole - gen.cached_tokens, 0)
        return {
            "input_tokens": max(gen.prompt_tokens - gen.cached_tokens - created, 0),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": gen.cached_tokens,
        }

    def content(self) -> list[JSON]:
        choice = self.choice
        blocks: list[JSON] = []
        if choice.text or not choice.tool_calls:
            blocks.append({"type": "text", "text": choice.text})
        for call in choice.tool_calls:
            blocks.append(
                {
                    "type": "tool_use",
                    "id": call.id,
                    "name": call.name,
                    "input": _tool_input(call.arguments),
                }
            )
        return blocks

    def message(self) -> JSON:
        reason, sequence = stop_reason(self.choice)
        body: JSON = {
            "id": self.gen.id,
            "type": "message",
            "role": "assistant",
            "model": self.gen.model,
            "content": self.content(),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self.usage(self.gen.completion_tokens),
        }
        if self.flavor == "vllm" and sequence is None:
            del body["stop_sequence"]  # vLLM dumps its answer with exclude_none
        return body

    def events(self) -> Iterator[Step]:
        """The event stream; a step is paced when it carries a decoded token."""
        start = {**self.message(), "content": [], "stop_reason": None, "stop_sequence": None}
        start["usage"] = self.usage(1 if self.flavor == "anthropic" else 0)
        yield [{"type": "message_start", "message": start}], False
        index = 0
        if self.choice.text or not self.choice.tool_calls:
            yield from self._block({"type": "text", "text": ""}, index, self._text_deltas())
            index += 1
        for position, call in enumerate(self.choice.tool_calls):
            head = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            pieces = self.choice.argument_pieces[position]
            deltas = ({"type": "input_json_delta", "partial_json": p} for p in pieces)
            yield from self._block(head, index, deltas)
            index += 1
        reason, sequence = stop_reason(self.choice)
        output = self.gen.completion_tokens
        usage = {"output_tokens": output} if self.flavor == "anthropic" else self.usage(output)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        yield [{"type": "message_delta", "delta": delta, "usage": usage}], False
        yield [{"type": "message_stop"}], False

    def _text_deltas(self) -> Iterator[JSON]:
        return ({"type": "text_delta", "text": piece} for piece in self.choice.pieces)

    def _block(self, head: JSON, index: int, deltas: Iterator[JSON]) -> Iterator[Step]:
        opening: list[JSON] = [
            {"type": "content_block_start", "index": index, "content_block": head}
        ]
        if index == 0 and self.flavor == "anthropic":
            opening.append({"type": "ping"})
        yield opening, False
        for delta in deltas:
            yield [{"type": "content_block_delta", "index": index, "delta": delta}], True
        yield [{"type": "content_block_stop", "index": index}], False


def count_tokens_body(prompt_tokens: int, flavor: Flavor) -> JSON:
    if flavor == "anthropic":
        return {"input_tokens": prompt_tokens}
    return {
        "input_tokens": prompt_tokens,
        "context_management": {"original_input_tokens": prompt_tokens},
    }
