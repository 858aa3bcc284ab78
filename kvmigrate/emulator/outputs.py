"""What one request generated, before any dialect turns it into wire JSON."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Choice:
    """One of the request's `n` answers: text pieces (one per token) or tool calls."""

    index: int
    pieces: tuple[str, ...]
    finish_reason: str
    stop_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    argument_pieces: tuple[tuple[str, ...], ...] = ()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        # A tool call costs its argument tokens plus the call syntax around them.
        tool_tokens = sum(len(p) + 6 for p in self.argument_pieces)
        return len(self.pieces) + tool_tokens


@dataclass(frozen=True, slots=True)
class Generation:
    id: str
    created: int
    model: str
    prompt_tokens: int
    cached_tokens: int
    choices: tuple[Choice, ...]
    cache_written: int = 0  # Anthropic's cache_creation_input_tokens (emulator.breakpoint_cache)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)
