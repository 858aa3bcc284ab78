"""Structured output, embeddings, models, and the Responses API."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from typing import Any

import openai
import pytest
from emulator_support import (
    StartEmulator,
    chat_body,
    client,
    model_of,
    profile_of,
    raw,
    sse_data,
)

from kvmigrate.serving import BackgroundServer

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "role": {"type": "string", "enum": ["admin", "user"]},
        "address": {"$ref": "#/$defs/Address"},
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["name", "age", "tags", "role", "address", "nickname"],
    "additionalProperties": False,
    "$defs": {
        "Address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        }
    },
}


def test_json_object_mode(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=[{"role": "user", "content": "Describe volcanoes as JSON"}],
            response_format={"type": "json_object"},
        )
    # The emulator's JSON mode, field by field: a small object about the prompt's topic.
    document = json.loads(reply.choices[0].message.content or "")
    assert set(document) == {"topic", "answer", "confidence"}
    assert document["topic"].lower() in {"describe", "volcanoes", "json"}
    assert isinstance(document["answer"], str)
    assert document["answer"].strip()
    assert isinstance(document["confidence"], float)
    assert 0 < document["confidence"] <= 1
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0


def test_json_schema_mode(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(any_server),
            messages=[{"role": "user", "content": "Invent a person living in Berlin"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": PERSON, "strict": True},
            },
        )
    person = json.loads(reply.choices[0].message.content or "")
    assert set(person) == set(PERSON["required"])  # type: ignore[arg-type]
    assert isinstance(person["name"], str)
    assert len(person["name"]) >= 2
    assert isinstance(person["age"], int)
    assert 0 <= person["age"] <= 120
    assert person["tags"]
    assert all(isinstance(t, str) for t in person["tags"])
    assert person["role"] in ("admin", "user")
    assert set(person["address"]) == {"city", "zip"}
    assert isinstance(person["nickname"], str)


def test_embeddings_float_and_base64(any_server: BackgroundServer) -> None:
    texts = ["the cat sat on the mat", "a cat sat on a mat", "quarterly revenue grew"]
    model = "text-embedding-3-small" if profile_of(any_server) == "hosted" else model_of(any_server)
    with client(any_server) as sdk:
        # The SDK asks for base64 by default and decodes it to floats.
        decoded = sdk.embeddings.create(model=model, input=texts)
        floats = sdk.embeddings.create(model=model, input=texts, encoding_format="float")
    status, _, body = raw(
        any_server,
        "POST",
        "/v1/embeddings",
        {"model": model, "input": "x", "encoding_format": "base64"},
    )
    assert status == 200
    packed = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    assert len(packed) == 4 * 1536
    assert math.isclose(sum(v * v for v in struct.unpack("<1536f", packed)), 1.0, rel_tol=1e-4)
    vectors = [d.embedding for d in floats.data]
    assert [len(v) for v in vectors] == [1536] * 3
    for a, b in zip(decoded.data, floats.data, strict=True):
        assert all(
            math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6)
            for x, y in zip(a.embedding, b.embedding, strict=True)
        )

    def cosine(a: list[float], b: list[float]) -> float:
        return sum(x * y for x, y in zip(a, b, strict=True))

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2
    assert floats.usage.prompt_tokens > 0


def test_embeddings_dimensions(hosted_server: BackgroundServer) -> None:
    with client(hosted_server) as sdk:
        reply = sdk.embeddings.create(
            model="text-embedding-3-small", input="hello", dimensions=256, encoding_format="float"
        )
    assert len(reply.data[0].embedding) == 256


def test_models_list(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        models = list(sdk.models.list())
        one = sdk.models.retrieve(model_of(any_server))
    assert next(m.id for m in models) == model_of(any_server)
    assert one.id == model_of(any_server)
    if profile_of(any_server) == "hosted":
        assert [m.id for m in models] == ["gpt-4o-mini", "text-embedding-3-small"]
        assert models[0].owned_by == "system"
    else:
        card: dict[str, Any] = models[0].model_dump()
        assert card["owned_by"] == "vllm"
        assert card["root"] == model_of(any_server)
        assert card["parent"] is None
        assert card["max_model_len"] == 131072
        assert card["permission"][0]["object"] == "model_permission"


def test_responses_api_non_streamed(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        response = sdk.responses.create(
            model=model_of(any_server),
            instructions="Be brief.",
            input="Tell me about glaciers in Iceland",
        )
    assert re.fullmatch(r"resp_[0-9a-f]{48}", response.id)
    assert response.status == "completed"
    assert response.output[0].type == "message"
    assert "glaciers" in response.output_text.lower() or "iceland" in response.output_text.lower()
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens


def test_responses_api_streamed_events(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk:
        stream = sdk.responses.create(
            model=model_of(any_server), input="Tell me about glaciers", stream=True
        )
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    completed = events[-1].response  # type: ignore[union-attr]
    assert text == completed.output_text
    assert text


def test_responses_api_function_call_and_raw_sse(vllm_server: BackgroundServer) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    body = {
        "model": model_of(vllm_server),
        "input": "Weather in Oslo?",
        "tools": [tool],
        "stream": True,
    }
    status, _, raw_body = raw(vllm_server, "POST", "/v1/responses", body)
    assert status == 200
    assert b"event: response.function_call_arguments.delta\n" in raw_body
    assert b"[DONE]" not in raw_body
    final = json.loads(sse_data(raw_body)[-1])["response"]
    call = final["output"][0]
    assert call["type"] == "function_call"
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Oslo"}


def test_responses_incomplete_on_max_output_tokens(hosted_server: BackgroundServer) -> None:
    status, _, body = raw(
        hosted_server,
        "POST",
        "/v1/responses",
        {
            "model": model_of(hosted_server),
            "input": chat_body(hosted_server, "x")["messages"],
            "max_output_tokens": 16,
            "text": {"format": {"type": "json_schema", "name": "p", "schema": PERSON}},
        },
    )
    response = json.loads(body)
    assert status == 200
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 16


def test_responses_api_continues_a_stored_chain(any_server: BackgroundServer) -> None:
    """previous_response_id continues the stored conversation: each turn's prompt extends
    the last, so the prefix cache reuses it; the instructions are not inherited."""
    with client(any_server) as sdk:
        ids: list[str] = []
        inputs: list[int] = []
        cached: list[int] = []
        for turn in range(1, 5):
            response = sdk.responses.create(
                model=model_of(any_server),
                instructions="You are a travel assistant. " * 300,  # hosted caches from 1024
                input=f"Tell me about glaciers, part {turn}",
                previous_response_id=ids[-1] if ids else None,
            )
            ids.append(response.id)
            assert response.previous_response_id == (ids[-2] if turn > 1 else None)
            assert response.usage is not None
            inputs.append(response.usage.input_tokens)
            cached.append(response.usage.input_tokens_details.cached_tokens)
    assert inputs == sorted(inputs)
    assert len(set(inputs)) == 4  # the history grows
    assert cached[1:] == sorted(cached[1:])
    assert cached[1] > 0


def test_responses_api_unknown_previous_response_is_a_404(any_server: BackgroundServer) -> None:
    status, _, body = raw(
        any_server,
        "POST",
        "/v1/responses",
        {"model": model_of(any_server), "input": "hi", "previous_response_id": "resp_elsewhere"},
    )
    error = json.loads(body)["error"]
    assert status == 404
    assert error["type"] == "invalid_request_error"
    assert "resp_elsewhere" in error["message"]


def test_responses_api_store_false_or_disabled_keeps_nothing(
    start_emulator: StartEmulator,
) -> None:
    """`store: false` answers are not kept; a vLLM without its response store keeps none."""
    stateless = start_emulator("vllm", responses_store=False)
    for server, store in ((stateless, True), (start_emulator("hosted"), False)):
        with client(server) as sdk:
            first = sdk.responses.create(model=model_of(server), input="hi", store=store)
            with pytest.raises(openai.NotFoundError):
                sdk.responses.create(
                    model=model_of(server), input="more", previous_response_id=first.id
                )
