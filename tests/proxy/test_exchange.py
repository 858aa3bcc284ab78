"""The one exchange type (kvmigrate.exchange) and the state it crosses a pipe as."""

from __future__ import annotations

import pickle
from dataclasses import fields

import pytest

from kvmigrate.exchange import STATE_FIELDS, Exchange, exchange_from_state, exchange_scalars
from kvmigrate.proxy import exchange as proxy_exchange
from kvmigrate.recorder.convert import to_record
from kvmigrate.recorder.crossing import pack, unpack


def _exchange() -> Exchange:
    x = Exchange(
        "req_1", "chat/completions", "vllm", "shadow", "gpt-4o-mini", "llama", "conv", 3,
        True, 10.0, b'{"messages": []}', 200, "stream_broken", 10.5, 11.0, "hosted",
        "req_0", True, "session",
    )  # fmt: skip
    x.continuity = object()  # stays in the proxy's process
    x.chunks = [b'data: {"usage": {"prompt_tokens": 4}}\n\n', b"data: [DONE]\n\n"]
    return x


def test_the_state_is_the_leading_fields_and_the_chunks() -> None:
    names = [f.name for f in fields(Exchange)]
    assert list(STATE_FIELDS[:-1]) == names[: len(STATE_FIELDS) - 1]
    assert STATE_FIELDS[-1] == "chunks"
    assert "continuity" not in STATE_FIELDS


def test_the_state_rebuilds_the_exchange_in_a_worker() -> None:
    x = _exchange()
    back = exchange_from_state(pickle.loads(pickle.dumps((*exchange_scalars(x), x.chunks))))
    for name in STATE_FIELDS:
        assert getattr(back, name) == getattr(x, name), name
    assert back.continuity is None
    unpacked, ts = unpack(pickle.loads(pickle.dumps(pack(x, 7.0))))
    assert ts == 7.0
    assert unpacked.chunks == [b"".join(x.chunks)]
    assert unpacked.usage == x.usage == {"prompt_tokens": 4}


def test_the_proxy_imports_the_same_type() -> None:
    assert proxy_exchange.Exchange is Exchange


def test_a_whole_answer_is_parsed_once_for_its_usage_and_its_readers() -> None:
    """The metrics' usage, conversation identity and the tool-call check all read the
    answer: one parse on the proxy's loop, not one each."""
    x = _exchange()
    x.stream = False
    x.chunks = [b'{"id": "chatcmpl-1", "choices": [], ', b'"usage": {"prompt_tokens": 9}}']
    assert x.usage == {"prompt_tokens": 9}
    answer = x.answer()
    assert answer == {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 9}}
    assert x.answer() is answer
    assert x.usage is answer["usage"]


def test_a_streamed_answer_is_reassembled() -> None:
    x = _exchange()
    x.chunks = [
        b'data: {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",'
        b' "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    answer = x.answer()
    assert answer is not None
    assert answer["choices"][0]["message"]["content"] == "hi"
    assert x.answer() is answer


@pytest.mark.parametrize(
    ("stream", "status", "ttft"),
    [
        (True, 200, 0.25),
        (True, 500, None),  # an error's first byte is no first token
        (True, 400, None),
        (True, None, None),
        (False, 200, None),  # a whole answer's first byte is its latency
    ],
)
def test_ttft_is_a_streamed_answer_s_first_byte(
    stream: bool, status: int | None, ttft: float | None
) -> None:
    x = Exchange("r", "chat/completions", "vllm", "serve", "m", "m", "c", 1, stream, 10.0)
    x.status, x.first_byte = status, 10.25
    assert x.ttft == ttft
    assert to_record(x, 0.0, "none", "test").ttft_ms == (None if ttft is None else ttft * 1000)
