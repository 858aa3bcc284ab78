"""Chat completions through the official SDK: shapes of both dialects, streamed and not."""

from __future__ import annotations

import asyncio
import json
import re

from emulator_support import async_client, chat_body, client, model_of, profile_of, raw, sse_data

from kvmigrate.serving import BackgroundServer

QUESTION = "Explain how photosynthesis converts sunlight into chemical energy"


def test_chat_non_streamed_hosted_shape(hosted_server: BackgroundServer) -> None:
    status, _, body = raw(
        hosted_server, "POST", "/v1/chat/completions", chat_body(hosted_server, QUESTION)
    )
    assert status == 200
    data = json.loads(body)
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]{29}", data["id"])
    assert data["object"] == "chat.completion"
    assert re.fullmatch(r"fp_[0-9a-f]{10}", data["system_fingerprint"])
    assert data["service_tier"] == "default"
    message = data["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert message["refusal"] is None
    assert message["annotations"] == []
    assert "tool_calls" not in message
    assert data["choices"][0]["finish_reason"] == "stop"
    assert "stop_reason" not in data["choices"][0]
    usage = data["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
    assert set(usage["completion_tokens_details"]) == {
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    }


def test_chat_non_streamed_vllm_shape(vllm_server: BackgroundServer) -> None:
    status, _, body = raw(
        vllm_server, "POST", "/v1/chat/completions", chat_body(vllm_server, QUESTION)
    )
    assert status == 200
    data = json.loads(body)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", data["id"])
    assert data["system_fingerprint"] is None
    assert data["service_tier"] is None
    assert data["prompt_logprobs"] is None
    assert data["kv_transfer_params"] is None
    choice = data["choices"][0]
    assert choice["stop_reason"] is None
    assert choice["message"]["tool_calls"] == []
    assert choice["message"]["refusal"] is None
    assert set(data["usage"]) == {
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
    }
    assert data["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_sdk_answer_reuses_prompt_words(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server), messages=[{"role": "user", "content": QUESTION}]
        )
    text = reply.choices[0].message.content or ""
    assert "photosynthesis" in text.lower() or "sunlight" in text.lower()
    assert 20 <= reply.usage.completion_tokens <= 80  # type: ignore[union-attr]


def test_stream_chunks_role_first_done_last(any_server: BackgroundServer) -> None:
    status, headers, body = raw(
        any_server, "POST", "/v1/chat/completions", chat_body(any_server, QUESTION, stream=True)
    )
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    payloads = sse_data(body)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    # Without include_usage neither dialect sends usage.
    assert all(c.get("usage") is None for c in chunks)
    assert "usage" not in chunks[0] or profile_of(any_server) == "hosted"


def test_stream_include_usage_final_chunk(any_server: BackgroundServer) -> None:
    body = chat_body(any_server, QUESTION, stream=True, stream_options={"include_usage": True})
    _, _, raw_body = raw(any_server, "POST", "/v1/chat/completions", body)
    chunks = [json.loads(p) for p in sse_data(raw_body)[:-1]]
    last = chunks[-1]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == len(chunks) - 3  # role, finish, usage chunks
    if profile_of(any_server) == "hosted":
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    else:
        assert all("usage" not in c for c in chunks[:-1])


def test_sdk_stream_reassembles_same_text_as_usage(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        stream = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            stream_options={"include_usage": True},
            seed=7,
        )
        text = ""
        usage = None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if chunk.usage is not None:
                usage = chunk.usage
        reply = sdk.chat.completions.create(
            model=model_of(any_server), messages=[{"role": "user", "content": QUESTION}], seed=7
        )
    assert usage is not None
    assert usage.completion_tokens > 0
    assert text == reply.choices[0].message.content


def test_max_tokens_cuts_with_length(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=[{"role": "user", "content": QUESTION}],
            max_completion_tokens=5,
        )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5


def test_stop_sequence_cuts_text(vllm_server: BackgroundServer) -> None:
    with client(vllm_server) as sdk:
        full = sdk.chat.completions.create(
            model=model_of(vllm_server), messages=[{"role": "user", "content": QUESTION}], seed=3
        )
        text = full.choices[0].message.content or ""
        stop = text.split()[3]
        cut = sdk.chat.completions.create(
            model=model_of(vllm_server),
            messages=[{"role": "user", "content": QUESTION}],
            seed=3,
            stop=[stop],
        )
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].model_extra is not None
    assert cut.choices[0].model_extra["stop_reason"] == stop


def test_n_choices(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server), messages=[{"role": "user", "content": QUESTION}], n=3
        )
        stream = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=[{"role": "user", "content": QUESTION}],
            n=2,
            stream=True,
        )
        finished = {c.index for chunk in stream for c in chunk.choices if c.finish_reason}
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content for c in reply.choices)
    assert finished == {0, 1}


def test_async_client_streams(any_server: BackgroundServer) -> None:
    async def run() -> str:
        async with async_client(any_server) as sdk:
            stream = await sdk.chat.completions.create(
                model=model_of(any_server),
                messages=[{"role": "user", "content": QUESTION}],
                stream=True,
            )
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream]
        return "".join(parts)

    assert len(asyncio.run(run())) > 20


def test_legacy_completions(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.completions.create(
            model=model_of(any_server), prompt="Once upon a time", seed=1
        )
        stream = sdk.completions.create(
            model=model_of(any_server),
            prompt="Once upon a time",
            max_tokens=4,
            seed=1,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert reply.object == "text_completion"
    assert reply.choices[0].finish_reason == "length"  # the endpoint's default of 16 tokens
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 16
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed
    assert reply.choices[0].text.startswith(streamed)
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
