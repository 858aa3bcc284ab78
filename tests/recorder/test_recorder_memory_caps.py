"""What one exchange may hold for the recorder is bounded (issue 21 item 10)."""

from __future__ import annotations

import orjson

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder.crossing import pack, unpack
from kvmigrate.redaction import Redactor
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES, ChunkLog

MIB = 1024 * 1024


def _exchange(stream: bool, body: bytes = b"{}") -> Exchange:
    return Exchange(
        "req_1", "chat/completions", "hosted", "serve", "m", "m", "c", 1, stream, 0.0, body
    )


def test_a_long_answer_keeps_its_head_and_its_usage_tail_and_counts_the_rest() -> None:
    chunks = ChunkLog()
    chunk = b"data: " + b"x" * (64 * 1024 - 8) + b"\n\n"
    total = 0
    for _ in range(200 * MIB // len(chunk)):  # a 200 MB stream
        chunks.append(chunk)
        total += len(chunk)
    usage = b'data: {"usage": {"prompt_tokens": 7, "completion_tokens": 9}}\n\n'
    chunks.append(usage)
    kept = sum(map(len, chunks))
    assert kept <= MAX_RECORDED_BYTES + 9 * len(chunk)
    assert kept + chunks.dropped == total + len(usage)
    assert chunks[-1] == usage


def test_the_exchange_reads_usage_from_a_capped_stream() -> None:
    exchange = _exchange(stream=True)
    for _ in range(3 * MAX_RECORDED_BYTES // (64 * 1024)):
        exchange.chunks.append(b"data: " + b"y" * (64 * 1024) + b"\n\n")
    exchange.chunks.append(b'data: {"usage": {"prompt_tokens": 7, "completion_tokens": 9}}\n\n')
    assert exchange.token_counts() == {"prompt": 7, "completion": 9}


def test_a_body_over_the_cap_crosses_to_the_recorder_as_a_marker_with_its_size() -> None:
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "' + b"z" * (30 * MIB) + b'"}]}'
    )
    exchange = _exchange(stream=False, body=body)
    for _ in range(MAX_RECORDED_BYTES // MIB + 20):
        exchange.chunks.append(b"a" * MIB)
    recorded, _ts = unpack(pack(exchange, 0.0))
    assert orjson.loads(recorded.request_body) == {"kvmigrate_not_recorded": {"bytes": len(body)}}
    answer = orjson.loads(recorded.chunks[0])
    assert answer == {"kvmigrate_not_recorded": {"bytes": (MAX_RECORDED_BYTES // MIB + 20) * MIB}}


def test_the_redaction_memo_is_bounded_by_size_not_only_by_count() -> None:
    redactor = Redactor(capacity=4096, max_chars=8 * MIB)
    for i in range(200):
        redactor.text(f"{i} " + "a long pasted document " * 20_000)  # ~460 kB each
    assert redactor._chars <= 8 * MIB + 1 * MIB
    assert sum(len(k) + len(v) for k, v in redactor._memo.items()) == redactor._chars
    assert sum(len(k) for k in redactor._older) <= 8 * MIB + 1 * MIB
