"""The official openai SDK, sync and async, through the proxy in front of emulated backends."""

from __future__ import annotations

import asyncio
import json

from proxy_support import HOSTED_MODEL, ProxyFactory

MESSAGES = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "What is the weather in Paris tomorrow?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
            },
        },
    }
]


def test_chat_non_streamed_with_headers(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy()
    raw = proxy.client().chat.completions.with_raw_response.create(
        model=HOSTED_MODEL, messages=MESSAGES
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert completion.model == HOSTED_MODEL
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 0
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    assert raw.headers["x-request-id"].startswith("req_")
    assert float(raw.headers["x-kvmigrate-overhead-ms"]) >= 0


def test_chat_streamed(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy()
    stream = proxy.client().chat.completions.create(
        model=HOSTED_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 3
    assert text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None


def test_tools_streamed_and_not(make_proxy: ProxyFactory) -> None:
    client = make_proxy().client()
    completion = client.chat.completions.create(
        model=HOSTED_MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required"
    )
    call = completion.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert call.id.startswith("call_")
    assert set(json.loads(call.function.arguments)) >= {"city", "unit"}
    args = ""
    for chunk in client.chat.completions.create(
        model=HOSTED_MODEL, messages=MESSAGES, tools=TOOLS, stream=True
    ):
        for delta in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            args += delta.function.arguments or ""
    assert json.loads(args)["unit"] in ("c", "f")


def test_json_mode(make_proxy: ProxyFactory) -> None:
    completion = (
        make_proxy()
        .client()
        .chat.completions.create(
            model=HOSTED_MODEL, messages=MESSAGES, response_format={"type": "json_object"}
        )
    )
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


def test_embeddings_and_models(make_proxy: ProxyFactory) -> None:
    client = make_proxy().client()
    embedding = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
    assert len(embedding.data) == 2
    assert len(embedding.data[0].embedding) > 10
    assert {m.id for m in client.models.list()} == {HOSTED_MODEL, "text-embedding-3-small"}


def test_async_client_concurrent_streams(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy()

    async def run() -> list[str]:
        async with proxy.async_client() as client:

            async def one(i: int) -> str:
                stream = await client.chat.completions.create(
                    model=HOSTED_MODEL,
                    stream=True,
                    messages=[{"role": "user", "content": f"question number {i}"}],
                )
                return "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )

            return await asyncio.gather(*(one(i) for i in range(20)))

    answers = asyncio.run(run())
    assert all(answers)
    assert len(answers) == 20


def test_unknown_fields_pass_through(make_proxy: ProxyFactory) -> None:
    completion = (
        make_proxy()
        .client()
        .chat.completions.create(
            model=HOSTED_MODEL,
            messages=MESSAGES,
            extra_body={"x_vendor_flag": {"a": [1, 2]}},
            seed=7,
            max_tokens=5,
        )
    )
    assert completion.choices[0].finish_reason in ("length", "stop")


def test_responses_api(make_proxy: ProxyFactory) -> None:
    # The emulator serves /v1/responses: a 404 here is a failure, not a reason to skip.
    client = make_proxy().client()
    response = client.responses.create(model=HOSTED_MODEL, input="Say hello")
    assert response.output_text
