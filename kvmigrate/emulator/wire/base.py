"""What both wire dialects share: ids, and the order of streamed chunks."""

from __future__ import annotations

import random
import string
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.outputs import Choice, Generation
from kvmigrate.emulator.settings import EmulatorSettings

JSON = dict[str, Any]
# One step of a stream: the chunks sent together, and whether the step costs a decode step.
Step = tuple[list[JSON], bool]
_ALNUM = string.ascii_letters + string.digits


class Dialect(ABC):
    def __init__(self, settings: EmulatorSettings, rng: random.Random) -> None:
        self.settings = settings
        self._rng = rng

    def alnum(self, length: int) -> str:
        return "".join(self._rng.choices(_ALNUM, k=length))

    def hex(self, length: int) -> str:
        return f"{self._rng.getrandbits(4 * length):0{length}x}"

    @abstractmethod
    def chat_id(self) -> str: ...

    @abstractmethod
    def completion_id(self) -> str: ...

    @abstractmethod
    def tool_call_id(self) -> str: ...

    @abstractmethod
    def error_body(self, error: EmulatorError) -> JSON: ...

    @abstractmethod
    def usage(self, gen: Generation, *, detailed: bool = True) -> JSON: ...

    @abstractmethod
    def message(self, choice: Choice) -> JSON: ...

    @abstractmethod
    def chat_completion(self, gen: Generation) -> JSON: ...

    @abstractmethod
    def completion(self, gen: Generation) -> JSON: ...

    @abstractmethod
    def embeddings(self, model: str, data: list[JSON], prompt_tokens: int) -> JSON: ...

    @abstractmethod
    def model_list(self) -> JSON: ...

    @abstractmethod
    def _chunk(self, gen: Generation, choices: list[JSON], include_usage: bool) -> JSON: ...

    @abstractmethod
    def _role_delta(self, choice: Choice) -> JSON: ...

    @abstractmethod
    def _finish(self, choice: Choice, delta_key: str) -> JSON: ...

    @abstractmethod
    def _usage_chunk(self, gen: Generation, obj: str, detailed: bool) -> JSON: ...

    def _stream_choice(self, index: int, delta: JSON) -> JSON:
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}

    def _choice_steps(self, choice: Choice) -> Iterator[tuple[JSON, bool]]:
        """The chat deltas of one choice; the bool says whether a decode step precedes it."""
        yield self._stream_choice(choice.index, self._role_delta(choice)), False
        for position, call in enumerate(choice.tool_calls):
            head = {
                "index": position,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            yield self._stream_choice(choice.index, {"tool_calls": [head]}), True
            for piece in choice.argument_pieces[position]:
                fragment = {"index": position, "function": {"arguments": piece}}
                yield self._stream_choice(choice.index, {"tool_calls": [fragment]}), True
        for piece in choice.pieces:
            yield self._stream_choice(choice.index, {"content": piece}), True
        yield self._finish(choice, "delta"), False

    def chat_chunks(self, gen: Generation, include_usage: bool) -> Iterator[Step]:
        """`chat.completion.chunk`s; the `n` choices advance together, one token per step."""
        per_choice = [list(self._choice_steps(c)) for c in gen.choices]
        for step in range(max(len(steps) for steps in per_choice)):
            items = [steps[step] for steps in per_choice if step < len(steps)]
            chunk = self._chunk(gen, [item for item, _ in items], include_usage)
            yield [chunk], any(paced for _, paced in items)
        if include_usage:
            yield [self._usage_chunk(gen, "chat.completion.chunk", True)], False

    def completion_chunks(self, gen: Generation, include_usage: bool) -> Iterator[Step]:
        """Legacy `text_completion` chunks."""
        longest = max(len(c.pieces) for c in gen.choices)
        for step in range(longest):
            choices = [
                self._text_choice(c.index, c.pieces[step], None, None)
                for c in gen.choices
                if step < len(c.pieces)
            ]
            yield [self._completion_chunk(gen, choices, include_usage)], True
        finals = [self._finish(c, "text") for c in gen.choices]
        yield [self._completion_chunk(gen, finals, include_usage)], False
        if include_usage:
            yield [self._usage_chunk(gen, "text_completion", False)], False

    def _text_choice(
        self, index: int, text: str, finish_reason: str | None, stop_reason: str | None
    ) -> JSON:
        return {"text": text, "index": index, "logprobs": None, "finish_reason": finish_reason}

    def _completion_chunk(self, gen: Generation, choices: list[JSON], include_usage: bool) -> JSON:
        chunk: JSON = {
            "id": gen.id,
            "object": "text_completion",
            "created": gen.created,
            "model": gen.model,
            "choices": choices,
        }
        if include_usage:
            chunk["usage"] = None
        return chunk
