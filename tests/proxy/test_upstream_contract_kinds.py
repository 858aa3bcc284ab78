"""The upstream contract of test_upstream_contract.py for the other kinds of primary: Azure
OpenAI (its key in `api-key`, `api-version` in the query, the deployment in the path) and
Anthropic's Messages API (its key in `x-api-key`), each with a vLLM candidate, each driven
by its official SDK, in every key mode and both rollout modes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest
from edge_contracts import (
    AUTHS,
    CLIENT_HEADERS,
    CLIENT_QUERY,
    PRIMARY_KEY,
    Auth,
    Mode,
    Recorder,
    assert_call_keeps_the_contract,
    recording_emulators,
)

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

CANDIDATE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
DEPLOYMENT = "prod-gpt-4o-mini"
EMBED_DEPLOYMENT = "prod-embed"
CLAUDE = "claude-sonnet-4-5"
API_VERSION = "2024-10-21"
ROLLOUTS = {
    "shadow": "{mode: shadow, shadow_sample: 1.0, noise_sample: 0}",
    "split": "{mode: split, percent: 100, shadow_sample: 0, noise_sample: 0, fallback: false}",
}
Client = openai.OpenAI | anthropic.Anthropic


@dataclass(frozen=True)
class Kind:
    """A kind of primary: how its emulator runs, how the proxy's config names it, and how
    it carries its own key (header, value) and what its URLs always hold."""

    name: str
    emulator: EmulatorSettings
    backend: str  # the primary's config, less the key
    models: str
    own_key: tuple[str, str]
    primary_path: Callable[[str], str]  # the client's route -> the primary's path
    fixed_query: dict[str, str]


AZURE = Kind(
    "azure",
    EmulatorSettings("hosted", time_scale=0, azure=True, models=(DEPLOYMENT, EMBED_DEPLOYMENT)),
    f'type: azure, api_version: "{API_VERSION}"',
    f"""
  - {{model_name: gpt-4o-mini, hosted: {DEPLOYMENT}, vllm: {CANDIDATE_MODEL}}}
  - {{model_name: embed, hosted: {EMBED_DEPLOYMENT}, vllm: {CANDIDATE_MODEL}}}""",
    ("api-key", PRIMARY_KEY),
    lambda route: "/openai/deployments/{deployment}" + route.removeprefix("/v1"),
    {"api-version": API_VERSION},
)
ANTHROPIC = Kind(
    "anthropic",
    EmulatorSettings("anthropic", time_scale=0),
    "type: anthropic",
    f"\n  - {{model_name: {CLAUDE}, hosted: {CLAUDE}, vllm: {CANDIDATE_MODEL}}}",
    ("x-api-key", PRIMARY_KEY),
    lambda route: route,
    {},
)


@dataclass(frozen=True)
class Route:
    kind: Kind
    name: str
    path: str
    call: Callable[[Any], object]
    copied: bool = True


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello there"}]
    )


def _chat_stream(client: openai.OpenAI) -> object:
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello there"}], stream=True
    )
    return [chunk for chunk in stream]


def _completion(client: openai.OpenAI) -> object:
    return client.completions.create(model="gpt-4o-mini", prompt="hello there")


def _embedding(client: openai.OpenAI) -> object:
    return client.embeddings.create(model="embed", input="hello there")


def _message(client: anthropic.Anthropic) -> object:
    return client.messages.create(
        model=CLAUDE, max_tokens=32, messages=[{"role": "user", "content": "hello there"}]
    )


def _message_stream(client: anthropic.Anthropic) -> object:
    with client.messages.stream(
        model=CLAUDE, max_tokens=32, messages=[{"role": "user", "content": "hello there"}]
    ) as stream:
        return stream.get_final_message()


def _count_tokens(client: anthropic.Anthropic) -> object:
    return client.messages.count_tokens(
        model=CLAUDE, messages=[{"role": "user", "content": "hello there"}]
    )


ROUTES = (
    Route(AZURE, "chat", "/v1/chat/completions", _chat),
    Route(AZURE, "chat-stream", "/v1/chat/completions", _chat_stream),
    Route(AZURE, "completions", "/v1/completions", _completion),
    Route(AZURE, "embeddings", "/v1/embeddings", _embedding),
    Route(ANTHROPIC, "messages", "/v1/messages", _message),
    Route(ANTHROPIC, "messages-stream", "/v1/messages", _message_stream),
    Route(ANTHROPIC, "count-tokens", "/v1/messages/count_tokens", _count_tokens),
)


@pytest.fixture(scope="module")
def beds() -> Iterator[dict[str, tuple[dict[str, BackgroundServer], Recorder]]]:
    vllm = EmulatorSettings("vllm", time_scale=0, models=(CANDIDATE_MODEL,))
    with (
        recording_emulators({"hosted": AZURE.emulator, "vllm": vllm}) as azure,
        recording_emulators({"hosted": ANTHROPIC.emulator, "vllm": vllm}) as messages,
    ):
        yield {"azure": azure, "anthropic": messages}


def client_for(kind: Kind, url: str, key: str) -> Client:
    if kind is ANTHROPIC:
        return anthropic.Anthropic(
            base_url=url,
            api_key=key,
            max_retries=0,
            default_headers=CLIENT_HEADERS,
            default_query=CLIENT_QUERY,
        )
    return openai.OpenAI(
        base_url=url + "/v1",
        api_key=key,
        max_retries=0,
        default_headers=CLIENT_HEADERS,
        default_query=CLIENT_QUERY,
    )


def sent_names(route: Route, servers: dict[str, BackgroundServer], recorder: Recorder) -> set[str]:
    """The header names the client sends, as the primary's emulator receives them direct."""
    recorder.calls.clear()
    with client_for(route.kind, servers["hosted"].url, "sk-calibration") as direct:
        if route.kind is AZURE:  # the emulator's OpenAI-shaped routes serve a deployment
            direct.chat.completions.create(
                model=DEPLOYMENT, messages=[{"role": "user", "content": "x"}]
            )
        else:
            route.call(direct)
    names = recorder.calls[-1].names - {"host", "content-length", "accept-encoding"}
    recorder.calls.clear()
    return names


def cases() -> Iterator[Any]:
    for route in ROUTES:
        for auth in AUTHS:
            for rollout in ROLLOUTS:
                yield pytest.param(
                    route, auth, rollout, id=f"{route.kind.name}-{route.name}-{auth}-{rollout}"
                )


@pytest.mark.parametrize(("route", "auth", "rollout"), list(cases()))
def test_each_upstream_receives_exactly_its_share(
    beds: dict[str, tuple[dict[str, BackgroundServer], Recorder]],
    route: Route,
    auth: Auth,
    rollout: str,
) -> None:
    kind = route.kind
    servers, recorder = beds[kind.name]
    sent = sent_names(route, servers, recorder)
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{servers["hosted"].url}{"/v1" if kind is ANTHROPIC else ""}", {kind.backend}, read_timeout: 10 {auth.primary_extra()}}}
  vllm: {{api_base: "{servers["vllm"].url}/v1", read_timeout: 10 {auth.candidate_extra()}}}
models: {kind.models}
rollout: {ROLLOUTS[rollout]}
{auth.server()}
""",
        env={},
    )
    if rollout == "shadow":
        expected = [("primary", kind.primary_path(route.path))]
        expected += [("candidate", route.path)] * route.copied
    else:
        models = "/openai/models" if kind is AZURE else "/v1/models"  # Azure's Models - List
        check = [("key_check", models)] * (auth.mode is Mode.PASS_THROUGH)
        expected = [*check, ("candidate", route.path)]
    with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
        client = client_for(kind, proxy.url, auth.client_key)
        with client:
            route.call(client)
            calls = recorder.wait(len(expected))
    upstream = {"primary": "hosted", "key_check": "hosted", "candidate": "vllm"}
    assert [(c.upstream, _deployment(c.route)) for c in calls] == [
        (upstream[role], path) for role, path in expected
    ]
    for call, (role, _) in zip(calls, expected, strict=True):
        fixed = kind.fixed_query if role in ("primary", "key_check") else {}
        assert_call_keeps_the_contract(call, sent, role, auth, kind.own_key, fixed)


def _deployment(path: str) -> str:
    for name in (DEPLOYMENT, EMBED_DEPLOYMENT):
        path = path.replace(f"/deployments/{name}/", "/deployments/{deployment}/")
    return path
