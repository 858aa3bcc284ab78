"""Conversation identity and a long answer: an agent's tool call of tens of thousands of
deltas is reassembled by a task a slice at a time, the event loop free between slices,
never at once in the handler's task; an answer too long to keep whole is not linked."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.continuity.resolver import ContinuityResolver, Pending
from kvmigrate.exchange import SERVE, Exchange
from kvmigrate.policies.continuity import answer_digest, iter_answer
from kvmigrate.wire.assemble import SLICE_BYTES, assemble
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES
from kvmigrate.wire.sse import event_slices

ROUTE = "chat/completions"
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "Write the file."}]}


def tool_call_stream(deltas: int) -> list[bytes]:
    """A streamed tool call, one event per chunk, as the upstream's reads would bring it."""

    def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return b"data: " + orjson.dumps({"id": "c1", "model": "m", "choices": [choice]}) + b"\n\n"

    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "write"}}
    chunks = [event({"role": "assistant", "tool_calls": [head]})]
    opening = {"index": 0, "function": {"arguments": '{"text": "'}}
    chunks.append(event({"tool_calls": [opening]}))
    piece = {"tool_calls": [{"index": 0, "function": {"arguments": "ab cd "}}]}
    chunks += [event(piece)] * deltas
    closing = {"index": 0, "function": {"arguments": '"}'}}
    chunks.append(event({"tool_calls": [closing]}))
    return [*chunks, event({}, "tool_calls"), b"data: [DONE]\n\n"]


def served(pending: Pending, chunks: list[bytes]) -> Exchange:
    exchange = Exchange("r", ROUTE, "hosted", SERVE, "m", "m", pending.conversation, 1, True, 0.0)
    exchange.status, exchange.continuity = 200, pending
    for chunk in chunks:
        exchange.chunks.append(chunk)
    return exchange


def answer_link(pending: Pending, body: bytes) -> str:
    response = assemble(ROUTE, body)
    assert response is not None
    return answer_digest(pending.history.hasher, list(iter_answer(ROUTE, response)))


def test_a_long_answer_is_linked_by_a_task_that_lets_the_loop_run(tmp_path: Path) -> None:
    async def run() -> None:
        table = LinkTable(create_table(str(tmp_path)))
        resolver = ContinuityResolver(table=table)
        identity = await resolver.identify({}, REQUEST, "m", ROUTE)
        assert identity.pending is not None
        chunks = tool_call_stream(20_000)
        exchange = served(identity.pending, chunks)
        assert exchange.long_answer
        link = answer_link(identity.pending, b"".join(chunks))
        turns = 0

        async def elsewhere() -> None:  # everything else the worker's loop has to do
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        others = asyncio.create_task(elsewhere())
        resolver.exchange_done(exchange)
        # Before: reassembled and linked here, in the handler's task, the loop held meanwhile.
        assert table.get(link) is None
        async with asyncio.timeout(60):
            # The table has no event to wait on, only its contents; the loop turns as fast
            # as it can, as any other work on it would.
            while table.get(link) is None:  # noqa: ASYNC110
                await asyncio.sleep(0)
        assert table.get(link) == (identity.conversation, identity.turn)
        slices = sum(1 for _ in event_slices(b"".join(chunks), SLICE_BYTES))
        assert slices > 4
        assert turns >= slices - 1  # the rest of the loop ran between every two slices
        others.cancel()
        await resolver.done()

    asyncio.run(run())


def test_an_answer_too_long_to_keep_whole_is_not_linked(tmp_path: Path) -> None:
    async def run() -> None:
        table = LinkTable(create_table(str(tmp_path)))
        resolver = ContinuityResolver(table=table)
        identity = await resolver.identify({}, REQUEST, "m", ROUTE)
        assert identity.pending is not None
        chunks = tool_call_stream(MAX_RECORDED_BYTES // 100)
        exchange = served(identity.pending, chunks)
        assert exchange.answer_cut  # its middle was dropped: no answer the client has
        resolver.exchange_done(exchange)
        await resolver.done()
        assert table.get(answer_link(identity.pending, b"".join(chunks))) is None
        # The next turn still finds the conversation: by the link its request made.
        assert table.get(identity.pending.history.request_link) is not None

    asyncio.run(run())
