"""Error answers in each profile's envelope."""

from __future__ import annotations

import json

import openai
import pytest
from emulator_support import StartEmulator, chat_body, client, model_of, raw

from kvmigrate.serving import BackgroundServer


def test_unknown_model_hosted_envelope(hosted_server: BackgroundServer) -> None:
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw_body = raw(hosted_server, "POST", "/v1/chat/completions", body)
    assert status == 404
    assert json.loads(raw_body) == {
        "error": {
            "message": "The model `gpt-9` does not exist or you do not have access to it.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_unknown_model_vllm_envelope(vllm_server: BackgroundServer) -> None:
    body = {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}
    status, _, raw_body = raw(vllm_server, "POST", "/v1/chat/completions", body)
    assert status == 404
    assert json.loads(raw_body) == {
        "error": {
            "message": "The model `gpt-9` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
    }


def test_unknown_model_through_sdk(any_server: BackgroundServer) -> None:
    with client(any_server) as sdk, pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404


def test_bad_json_is_400(any_server: BackgroundServer) -> None:
    status, _, raw_body = raw(any_server, "POST", "/v1/chat/completions", b"{not json")
    error = json.loads(raw_body)["error"]
    assert status == 400
    assert "parse the JSON body" in error["message"]
    assert error["type"] in ("invalid_request_error", "BadRequestError")


@pytest.mark.parametrize(
    ("field", "value"),
    [("messages", []), ("max_tokens", 0), ("temperature", 3), ("n", 0), ("stop", 5)],
)
def test_invalid_parameters_are_400(
    hosted_server: BackgroundServer, field: str, value: object
) -> None:
    body = chat_body(hosted_server, "hello")
    body[field] = value
    status, _, raw_body = raw(hosted_server, "POST", "/v1/chat/completions", body)
    assert status == 400
    assert json.loads(raw_body)["error"]["type"] == "invalid_request_error"


def test_over_long_prompt_vllm(start_emulator: StartEmulator) -> None:
    server = start_emulator("vllm", max_model_len=256)
    long_text = "word " * 300
    status, _, raw_body = raw(server, "POST", "/v1/chat/completions", chat_body(server, long_text))
    error = json.loads(raw_body)["error"]
    assert status == 400
    assert error["type"] == "BadRequestError"
    assert error["code"] == 400
    assert "maximum context length is 256 tokens" in error["message"]
    # Prompt alone fits, prompt plus max_tokens does not: still a 400, never clamped.
    short = chat_body(server, "word " * 100, max_tokens=200)
    assert raw(server, "POST", "/v1/chat/completions", short)[0] == 400
    assert raw(server, "POST", "/v1/chat/completions", chat_body(server, "word " * 100))[0] == 200


def test_over_long_prompt_hosted(start_emulator: StartEmulator) -> None:
    server = start_emulator("hosted", max_model_len=256)
    status, _, raw_body = raw(server, "POST", "/v1/chat/completions", chat_body(server, "w " * 300))
    assert status == 400
    assert json.loads(raw_body)["error"]["code"] == "context_length_exceeded"
    too_many = chat_body(server, "hi", max_tokens=20_000)
    assert raw(server, "POST", "/v1/chat/completions", too_many)[0] == 400


@pytest.mark.parametrize("profile", ["hosted", "vllm"])
def test_api_key(start_emulator: StartEmulator, profile: str) -> None:
    server = start_emulator(profile, api_key="sk-secret-1234")
    model = model_of(server)
    with client(server, api_key="sk-secret-1234") as good:
        assert good.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
    with client(server, api_key="sk-wrong-0000") as bad, pytest.raises(openai.AuthenticationError):
        bad.models.list()
    status, _, raw_body = raw(server, "GET", "/v1/models")
    assert status == 401
    error = json.loads(raw_body)["error"]
    if profile == "hosted":
        assert error["type"] == "invalid_request_error"
        assert "didn't provide an API key" in error["message"]
    else:
        assert error == "Unauthorized"  # vLLM's authentication middleware answers this
    assert raw(server, "GET", "/health")[0] == 200
    status, _, raw_body = raw(
        server, "GET", "/v1/models", headers={"Authorization": "Bearer nope-abcd"}
    )
    if profile == "hosted":
        assert json.loads(raw_body)["error"]["code"] == "invalid_api_key"


def test_unknown_route(any_server: BackgroundServer) -> None:
    assert raw(any_server, "POST", "/v1/nothing", {})[0] == 404
