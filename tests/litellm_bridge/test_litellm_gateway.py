"""A `type: litellm` backend without litellm: a fake module stands in for it, so what the
gateway passes to litellm and makes of its answers and exceptions is checked exactly. The
real litellm runs in tests/litellm_bridge/test_litellm_backend.py."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import sys
import threading
import types
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.litellm_bridge.gateway import LiteLLMNotInstalled
from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.app import SERVICE_KEY
from kvmigrate.serving import BackgroundServer

MODEL_STRING = "bedrock/anthropic.claude-3-5-sonnet-20240620-v1:0"
HOSTED_KEY = "sk-hosted-config"
AWS_SECRET = "aws-secret-from-env"


def _chunk(content: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": content, "role": None, "provider_specific_fields": None}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "claude",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        "provider_specific_fields": None,
        "citations": None,
    }


class Dumped:
    """A pydantic-like answer, as litellm returns them."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def model_dump(self, mode: str, warnings: bool) -> dict[str, Any]:
        assert (mode, warnings) == ("json", False)
        return json.loads(json.dumps(self.data))


class FakeLiteLLM(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("litellm")
        self.calls: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.stream_error: BaseException | None = None
        self.release = threading.Event()  # a stream's second chunk waits for it
        self.more = 0  # chunks between the first and the last
        self.abandoned = threading.Event()  # the stream was closed before its end

    async def acompletion(self, **kwargs: Any) -> object:
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        if kwargs.get("stream"):
            return self._stream()
        message = {"role": "assistant", "content": "hi", "provider_specific_fields": None}
        return Dumped(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "claude",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                "provider_specific_fields": {},
            }
        )

    async def _stream(self) -> AsyncIterator[object]:
        try:
            yield Dumped(_chunk("Hel"))
            await asyncio.to_thread(self.release.wait, 10)
            if self.stream_error is not None:
                raise self.stream_error
            for _ in range(self.more):
                await asyncio.sleep(0.005)
                yield _chunk(".")
            yield _chunk("lo", "stop")
            usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "cost": 0.1}
            yield {**_chunk(None), "usage": usage}
        except GeneratorExit:
            self.abandoned.set()
            raise


class StatusError(Exception):
    """Shaped as litellm's exceptions: `status_code`, `message`, the provider's headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status
        self.message = message
        self.litellm_response_headers = headers or {}


def _config(vllm_url: str, rollout: str = "{mode: shadow, shadow_sample: 0}") -> Config:
    return parse_config(
        f"""
backends:
  hosted:
    type: litellm
    api_base: https://bedrock-runtime.example
    api_key: {HOSTED_KEY}
    read_timeout: 7
    litellm_params: {{aws_region_name: eu-west-1, aws_secret_access_key: os.environ/AWS}}
  vllm: {{api_base: "{vllm_url}/v1", connect_timeout: 1}}
models:
  - {{model_name: gpt-4o-mini, hosted: "{MODEL_STRING}", vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {rollout}
""",
        env={"AWS": AWS_SECRET},
    )


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLiteLLM:
    module = FakeLiteLLM()
    monkeypatch.setitem(sys.modules, "litellm", module)
    return module


@pytest.fixture
def proxy(fake: FakeLiteLLM) -> Iterator[BackgroundServer]:
    config = _config("http://127.0.0.1:9")
    with BackgroundServer(lambda: build_proxy_app(config)) as server:
        yield server


@pytest.fixture
def client(proxy: BackgroundServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0, timeout=5
    ) as client:
        yield client


def _chat(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], **extra
    )


def test_litellm_gets_the_openai_fields_and_the_config_credentials_only(
    fake: FakeLiteLLM, client: openai.OpenAI
) -> None:
    raw = _chat(
        client,
        temperature=0.2,
        extra_body={"api_base": "http://attacker.example", "aws_role_name": "admin"},
        extra_headers={"X-Api-Key": "sk-client-2"},
    )
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    assert raw.parse().choices[0].message.content == "hi"
    assert "provider_specific_fields" not in raw.http_response.text
    assert fake.calls == [
        {
            "model": MODEL_STRING,
            "messages": [{"role": "user", "content": "hello"}],
            "temperature": 0.2,
            "api_base": "https://bedrock-runtime.example",
            "api_key": HOSTED_KEY,
            "aws_region_name": "eu-west-1",
            "aws_secret_access_key": AWS_SECRET,
            "timeout": 7.0,
        }
    ]


def test_a_stream_is_relayed_chunk_by_chunk(fake: FakeLiteLLM, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = iter(stream)
    first = next(chunks)  # arrives while litellm still holds the second one back
    assert first.choices[0].delta.content == "Hel"
    fake.release.set()
    rest = list(chunks)
    assert [c.choices[0].delta.content for c in rest if c.choices] == ["lo"]
    assert rest[-1].choices == []  # OpenAI's usage chunk: litellm's empty choice dropped
    assert rest[-1].usage is not None
    assert rest[-1].usage.total_tokens == 5
    assert fake.calls[0]["stream"] is True
    assert fake.calls[0]["stream_options"] == {"include_usage": True}


def test_a_client_gone_mid_stream_closes_the_litellm_stream(
    fake: FakeLiteLLM, client: openai.OpenAI
) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    assert next(iter(stream)).choices[0].delta.content == "Hel"
    fake.more = 1000  # 5 s of chunks, unless the gateway closes the stream
    stream.close()
    fake.release.set()
    assert fake.abandoned.wait(3)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, openai.BadRequestError),
        (401, openai.AuthenticationError),
        (404, openai.NotFoundError),
        (429, openai.RateLimitError),
        (503, openai.InternalServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_litellm_exceptions_are_openai_errors_with_their_status(
    fake: FakeLiteLLM,
    client: openai.OpenAI,
    status: int,
    error: type[openai.APIStatusError],
    stream: bool,
) -> None:
    fake.error = StatusError(status, f"provider refused {HOSTED_KEY}", {"retry-after": "7"})
    with pytest.raises(error) as caught:
        _chat(client, stream=stream)
    assert caught.value.status_code == status
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["message"] == "provider refused ***"  # a key in a message is scrubbed
    assert body["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    assert caught.value.response.headers["retry-after"] == "7"


def test_an_unexpected_failure_is_a_bare_500(
    fake: FakeLiteLLM, client: openai.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake.error = RuntimeError(f"internal detail {AWS_SECRET}")
    with (
        caplog.at_level(logging.ERROR, logger="kvmigrate"),
        pytest.raises(openai.InternalServerError) as caught,
    ):
        _chat(client)
    # Logged with its traceback for the operator, the configured secret masked.
    assert "RuntimeError: internal detail ***" in caplog.text
    assert AWS_SECRET not in caplog.text
    assert caught.value.status_code == 500
    assert caught.value.body == {
        "message": "Backend `hosted` (litellm) failed: RuntimeError.",
        "type": "server_error",
        "param": None,
        "code": "upstream_error",
    }


def test_a_failure_mid_stream_ends_with_an_error_event(
    fake: FakeLiteLLM, client: openai.OpenAI
) -> None:
    fake.stream_error = StatusError(500, "the provider went away")
    fake.release.set()
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}], stream=True
    )
    with pytest.raises(openai.APIError, match="the provider went away"):
        list(stream)


def test_the_gateway_serves_only_the_proxy(proxy: BackgroundServer) -> None:
    gateway = proxy.app[SERVICE_KEY].gateways["hosted"]
    assert gateway.url.startswith("http://127.0.0.1:")
    for headers in ({}, {"Authorization": "Bearer sk-client"}, {"api-key": HOSTED_KEY}):
        request = urllib.request.Request(gateway.url + "/models", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=5)
        with caught.value as refused:
            assert refused.code == 401
            assert json.loads(refused.read())["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"model": "gpt-4o", "messages": []}', 404, "`gpt-4o` does not exist"),
    ],
)
def test_the_gateway_answers_bad_requests_in_openai_envelopes(
    proxy: BackgroundServer, fake: FakeLiteLLM, body: bytes, status: int, message: str
) -> None:
    gateway = proxy.app[SERVICE_KEY].gateways["hosted"]
    key = gateway.upstream_config().api_key
    assert key is not None
    request = urllib.request.Request(
        gateway.url + "/chat/completions",
        data=body,
        headers={"Authorization": "Bearer " + key.reveal(), "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    with caught.value as refused:
        assert refused.code == status
        assert message in json.loads(refused.read())["error"]["message"]
    assert fake.calls == []


def test_the_gateway_inflates_nothing(proxy: BackgroundServer, fake: FakeLiteLLM) -> None:
    """The proxy never compresses what it sends the gateway: a compressed body reaching it
    stays as it came (aiohttp's parser inflated it as it arrived, before the key's check)."""
    gateway = proxy.app[SERVICE_KEY].gateways["hosted"]
    key = gateway.upstream_config().api_key
    assert key is not None
    request = urllib.request.Request(
        gateway.url + "/chat/completions",
        data=gzip.compress(b'{"model": "gpt-4o-mini", "messages": []}'),
        headers={
            "Authorization": "Bearer " + key.reveal(),
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    with caught.value as refused:
        assert refused.code == 400
        assert "not valid JSON" in json.loads(refused.read())["error"]["message"]
    assert fake.calls == []


def test_other_paths_get_a_clear_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="not supported by a litellm backend"):
        client.files.list()
    assert [m.id for m in client.models.list()] == ["gpt-4o-mini"]


def test_a_failing_candidate_falls_back_to_the_litellm_primary(fake: FakeLiteLLM) -> None:
    config = _config("http://127.0.0.1:9", "{mode: split, percent: 100, fallback: true}")
    with (
        BackgroundServer(lambda: build_proxy_app(config)) as server,
        openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0) as client,
    ):
        raw = _chat(client)
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    assert raw.parse().choices[0].message.content == "hi"


def test_without_litellm_the_proxy_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(LiteLLMNotInstalled) as caught:
        build_proxy_app(_config("http://127.0.0.1:9"))
    assert str(caught.value) == "backend 'hosted' is type litellm: pip install 'kvmigrate[litellm]'"
