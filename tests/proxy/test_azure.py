"""An Azure OpenAI primary: deployment names in the path, api-version in the query, and the
key in the `api-key` header, against an emulator that speaks Azure's URL shape."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from kvmigrate.config import ConfigError, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

DEPLOYMENT = "prod-gpt-4o-mini"


@pytest.fixture(scope="module")
def azure() -> Iterator[BackgroundServer]:
    settings = EmulatorSettings(
        "hosted", time_scale=0, azure=True, api_key="azure-secret", models=(DEPLOYMENT,)
    )
    with BackgroundServer(lambda: build_app(settings)) as server:
        yield server


def proxy_for(azure_url: str, key: str = "azure-secret") -> BackgroundServer:
    config = parse_config(
        f"""
backends:
  hosted: {{type: azure, api_base: "{azure_url}", api_version: "2024-10-21", api_key: {key}}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: {DEPLOYMENT}, vllm: llama}}
rollout: {{mode: shadow, shadow_sample: 0}}
""",
        env={},
    )
    return BackgroundServer(lambda: build_proxy_app(config)).start()


def test_chat_reaches_the_azure_deployment(azure: BackgroundServer) -> None:
    proxy = proxy_for(azure.url)
    try:
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0) as c:
            completion = c.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
            )
            assert completion.choices[0].message.content
            assert completion.model == DEPLOYMENT
            chunks = list(
                c.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
                )
            )
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finally:
        proxy.stop()


def test_a_wrong_azure_key_is_the_backends_401(azure: BackgroundServer) -> None:
    proxy = proxy_for(azure.url, key="wrong")
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
            )
    finally:
        client.close()
        proxy.stop()


def test_azure_needs_an_api_version() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(
            """
backends:
  hosted: {type: azure, api_base: "https://x.openai.azure.com"}
  vllm: {api_base: "http://127.0.0.1:9/v1"}
""",
            env={},
        )
    assert caught.value.path == "backends.hosted.api_version"
