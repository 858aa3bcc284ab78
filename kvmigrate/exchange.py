"""One upstream call and what came of it, parsed lazily after the client has its answer.

The one definition of an exchange: the proxy fills it, the recorder, the cache-buster
detector and the metrics read it, and its state (`STATE_FIELDS`) is what crosses a pipe
to a worker process."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from operator import attrgetter
from typing import Any

import orjson

from kvmigrate.policies.outcome import ttft_counts
from kvmigrate.wire import anthropic_stream
from kvmigrate.wire.assemble import SLICE_BYTES, assemble, assemble_sliced
from kvmigrate.wire.chunk_log import ChunkLog
from kvmigrate.wire.sse import decode_all, json_objects, sse_payloads
from kvmigrate.wire.usage import token_counts


class Role(StrEnum):
    """What an upstream call is for. A StrEnum: a member equals its string, so records
    and JSON hold the same values as before."""

    SERVE = "serve"  # the answer the client gets
    SHADOW = "shadow"  # a copy to the candidate, compared with the answer it copies
    NOISE = "noise"  # a second call to the primary, to measure how much it disagrees with itself


SERVE, SHADOW, NOISE = Role.SERVE, Role.SHADOW, Role.NOISE


@dataclass(slots=True)
class Exchange:
    """Facts about one upstream call. Filled on the response path with plain assignments;
    anything that needs parsing (usage, the answer) is computed on demand, off that path."""

    request_id: str
    route: str
    backend: str
    role: Role
    model: str
    served_model: str
    conversation: str
    turn: int
    stream: bool
    started: float
    request_body: bytes = b""
    status: int | None = None
    error: str | None = None
    first_byte: float | None = None
    finished: float | None = None
    fallback_from: str | None = None
    pair_id: str | None = None  # a shadow copy: the request_id of the answer it copies
    has_shadow_copy: bool = False  # an answer a shadow copy will be compared with
    identity: str = ""  # how the conversation was known (kvmigrate.continuity.resolver.SOURCES)
    cohort: str = ""  # the rollout cohort it was routed in (a name from the config)
    # The conversation as the rollout store keys it (a declared key's keyed hash), when
    # that differs: a later turn that does not declare it again, served by another proxy, is
    # known only by that hash, so records group every turn by it (`grouping_key`). Set off
    # the response path, by conversation identity's `exchange_done`.
    conversation_in_store: str = ""
    # Decode timing, kept as the chunks are relayed (a clock read per chunk, nothing parsed):
    # when the last body chunk arrived, how many arrived after the first, and the longest
    # wait between two of them. With the usage's output tokens they give decode speed.
    # After the other state fields: a spool written before them replays with their defaults.
    last_chunk: float | None = None
    later_chunks: int = 0
    max_chunk_gap: float = 0.0
    continuity: Any = None  # what conversation identity remembers once the answer is whole
    chain: Any = None  # a Responses request's place in its chain (kvmigrate.continuity.chains)
    chunks: list[bytes] = field(default_factory=ChunkLog)
    _usage: dict[str, Any] | None = None
    _usage_parsed: bool = False
    _answer: dict[str, Any] | None = None
    _answer_parsed: bool = False

    @property
    def ttft(self) -> float | None:
        """Time to the first streamed byte. A non-streamed answer arrives whole, so its
        first byte is its last: that is latency, not TTFT, and is not reported as one. An
        error status is no first token either: a candidate failing in 2 ms would pull its
        TTFT percentiles down, and pass the TTFT gate, by failing."""
        if not self.stream or self.first_byte is None or not ttft_counts(self.status):
            return None
        return self.first_byte - self.started

    @property
    def decode_time(self) -> float | None:
        """Seconds from the first streamed byte to the last chunk: the decode after the
        first token, for a streamed answer that did not fail with an error status."""
        if self.ttft is None or self.last_chunk is None or self.first_byte is None:
            return None
        return self.last_chunk - self.first_byte

    @property
    def grouping_key(self) -> str:
        """The conversation's key at every one of its turns, whichever proxy served them."""
        return self.conversation_in_store or self.conversation

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and self.status < 400

    def body(self) -> bytes:
        return b"".join(self.chunks)

    def answer(self) -> dict[str, Any] | None:
        """The whole answer as its route's response object (a stream reassembled), parsed
        once for everyone in this process: the metrics' usage and conversation identity
        both read it."""
        if not self._answer_parsed:
            self._answer_parsed = True
            self._answer = assemble(self.route, self.body())
        return self._answer

    @property
    def answer_bytes(self) -> int:
        chunks = self.chunks
        return chunks.size if isinstance(chunks, ChunkLog) else sum(map(len, chunks))

    @property
    def answer_cut(self) -> bool:
        """Whether the answer's middle was not kept (`ChunkLog`): it cannot be reassembled."""
        chunks = self.chunks
        return isinstance(chunks, ChunkLog) and chunks.dropped > 0

    def events_body(self) -> bytes:
        """The answer's bytes up to its last line end where its middle was not kept (whole
        otherwise): the head's events, which a check of each event can read as they are."""
        chunks = self.chunks
        if not isinstance(chunks, ChunkLog) or not chunks.dropped:
            return self.body()
        head = b"".join(chunks.head())
        return head[: max(head.rfind(b"\n"), head.rfind(b"\r")) + 1]

    @property
    def long_answer(self) -> bool:
        """Whether reassembling the answer takes more than one slice of `answer_in_slices`:
        in the proxy's process, such an answer is reassembled that way, never whole."""
        return self.answer_bytes > SLICE_BYTES

    def answer_in_slices(self) -> Generator[None, None, dict[str, Any] | None]:
        """`answer()`, reassembled a slice at a time (drive it with kvmigrate.slices):
        on the proxy's loop, or on a thread beside it, a long answer in one go held the
        loop for as long as it took."""
        if self._answer_parsed:
            return self._answer
        answer = yield from assemble_sliced(self.route, self.body())
        if not self._answer_parsed:  # another reader may have been at it meanwhile
            self._answer, self._answer_parsed = answer, True
        return answer

    @property
    def usage(self) -> dict[str, Any] | None:
        if not self._usage_parsed:
            self._usage_parsed = True
            if not self.stream:
                answer = self.answer()
                self._usage = _usage_of(answer) if answer is not None else None
            elif self.route == anthropic_stream.ROUTE:
                self._usage = _messages_stream_usage(self.chunks)
            else:
                self._usage = _stream_usage(self.chunks)
        return self._usage

    def token_counts(self) -> dict[str, int]:
        """prompt, completion, cached (and for Messages, cache_write) tokens from usage."""
        return token_counts(self.usage or {})


# An exchange's state, what a worker process gets of it: its fields in their order, less
# what stays in the proxy's process (the usage parsed on demand, what conversation identity
# keeps for later). The scalars lead, so `Exchange(*scalars)` takes them; `chunks` is last.
_LOCAL = frozenset({"continuity", "chain"})
STATE_FIELDS = tuple(
    f.name for f in fields(Exchange) if not f.name.startswith("_") and f.name not in _LOCAL
)
exchange_scalars = attrgetter(*STATE_FIELDS[:-1])


def exchange_from_state(state: Sequence[Any]) -> Exchange:
    """An exchange from its scalars and its chunks, as `exchange_scalars` and the chunks
    (joined into one bytes object, which pickles faster) crossed the pipe."""
    exchange = Exchange(*state[:-1])
    exchange.chunks = state[-1]
    return exchange


def _last_usage_line(tail: bytes) -> dict[str, Any] | None:
    """The usage of the `data:` line holding the tail's last `"usage"`, when that line is a
    whole JSON object that has one; else None, and the caller decodes the events. A stream's
    usage is on its last data line but one: this finds it without decoding the others, which
    cost more than anything else the proxy did with a finished stream."""
    at = tail.rfind(b'"usage"')
    if at < 0:
        return None
    start = tail.rfind(b"\n", 0, at) + 1
    end = tail.find(b"\n", at)
    line = tail[start : end if end >= 0 else len(tail)]
    if not line.startswith(b"data:"):
        return None
    try:
        data = orjson.loads(line[5:])
    except orjson.JSONDecodeError:  # an event whose data spans lines, or a cut-off one
        return None
    return _usage_of(data) if isinstance(data, dict) else None


def _usage_of(data: dict[str, Any]) -> dict[str, Any] | None:
    usage = data.get("usage")
    if usage is None and isinstance(data.get("response"), dict):
        usage = data["response"].get("usage")
    return usage if isinstance(usage, dict) else None


def _messages_stream_usage(chunks: list[bytes]) -> dict[str, Any] | None:
    """A Messages stream splits its usage between `message_start` (the input counts, at the
    head) and `message_delta` (the output count, at the tail). The first and last eight
    chunks are read first; a line cut at a window's edge fails to parse, and then the
    whole body is read. Only the events that mention usage are parsed."""
    if len(chunks) > 2 * _WINDOW:
        found = _usage_events(b"".join(chunks[:_WINDOW]))
        found += _usage_events(b"".join(chunks[-_WINDOW:]))
        if {"message_start", "message_delta"} <= {e.get("type") for e in found}:
            return anthropic_stream.merged_stream_usage(found)
    return anthropic_stream.merged_stream_usage(_usage_events(b"".join(chunks)))


_WINDOW = 8


def _usage_events(data: bytes) -> list[dict[str, Any]]:
    return [
        event
        for payload in sse_payloads(data)
        if b'"usage"' in payload
        for event in json_objects(payload)
    ]


def _stream_usage(chunks: list[bytes]) -> dict[str, Any] | None:
    """The usage object of the last SSE event that carries one (chat, completions, responses).

    Usage comes at the end: the last two chunks are decoded first, then the last eight,
    then all. A window's first line may be the tail of an event cut off; the decoder
    ignores it, and a usage event cut that way is found in the next, wider window."""
    found = _last_usage_line(b"".join(chunks[-2:]))
    if found is not None:
        return found
    for window in (chunks[-2:], chunks[-8:], chunks):
        tail = b"".join(window)
        if b'"usage"' not in tail:
            continue
        for event in reversed(decode_all(tail)):
            if b'"usage"' not in event.data:
                continue
            for data in reversed(json_objects(event.data)):
                usage = _usage_of(data)
                if usage is not None:
                    return usage
        if len(window) == len(chunks):
            break
    return None
