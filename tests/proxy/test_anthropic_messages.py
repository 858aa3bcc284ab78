"""Anthropic's Messages API through the proxy, with the official anthropic SDK as the client:
the anthropic emulator is the primary, the vllm emulator's /v1/messages the candidate."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic_support import (
    CLAUDE,
    CLIENT_KEY,
    FAULTS_ALLOWED,
    VLLM_MODEL,
    WEATHER,
    Exchanges,
    MessagesProxy,
    MessagesProxyFactory,
    ask,
    messages_config,
)
from proxy_support import Recorded

from kvmigrate.config import ConfigError, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer
from kvmigrate.wire.anthropic_stream import assemble_messages


@pytest.fixture(scope="module")
def emulators() -> Iterator[tuple[BackgroundServer, BackgroundServer]]:
    # The primary checks the client's key: an answer proves the key reached it.
    primary = EmulatorSettings(profile="anthropic", time_scale=0, api_key=CLIENT_KEY)
    candidate = EmulatorSettings(profile="vllm", time_scale=0)
    with (
        BackgroundServer(lambda: build_app(primary)) as hosted,
        BackgroundServer(lambda: build_app(candidate)) as vllm,
    ):
        yield hosted, vllm


@pytest.fixture
def make_proxy(
    emulators: tuple[BackgroundServer, BackgroundServer],
) -> Iterator[MessagesProxyFactory]:
    running: list[MessagesProxy] = []

    def make(
        rollout: str = "{mode: shadow, noise_sample: 0}",
        candidate_url: str | None = None,
        addons: tuple[object, ...] = (),
        **kwargs: str,
    ) -> MessagesProxy:
        config = messages_config(
            emulators[0].url, candidate_url or emulators[1].url, rollout, **kwargs
        )
        exchanges = Exchanges()
        server = BackgroundServer(
            lambda: build_proxy_app(config, addons=[exchanges, *addons])
        ).start()
        proxy = MessagesProxy(server, exchanges)
        running.append(proxy)
        return proxy

    yield make
    for proxy in running:
        for client in proxy.clients:
            client.close()
        proxy.server.stop()


def test_shadow_non_streamed_primary_answers_candidate_gets_a_copy(
    make_proxy: MessagesProxyFactory,
) -> None:
    proxy = make_proxy()
    raw = proxy.client().messages.with_raw_response.create(**ask("Describe the harbour"))
    message = raw.parse()
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    assert message.id.startswith("msg_01")
    assert message.model == CLAUDE
    assert message.content[0].type == "text"
    assert message.content[0].text
    done = proxy.exchanges.wait(2)
    shadow = next(e for e in done if e.role == "shadow")
    assert (shadow.route, shadow.backend, shadow.status) == ("messages", "vllm", 200)
    assert json.loads(shadow.request_body)["model"] == VLLM_MODEL
    assert json.loads(shadow.body())["type"] == "message"


def test_streamed_events_relay_and_the_copy_streams_too(make_proxy: MessagesProxyFactory) -> None:
    proxy = make_proxy()
    seen: list[str] = []
    with proxy.client().messages.stream(**ask("Tell me about tides")) as stream:
        for event in stream:
            seen.append(event.type)
        final = stream.get_final_message()
        assert stream.response.headers["x-kvmigrate-backend"] == "hosted"
    assert seen[0] == "message_start"
    assert seen[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(seen)
    assert final.content[0].text
    assert final.usage.output_tokens > 0
    shadow = next(e for e in proxy.exchanges.wait(2) if e.role == "shadow")
    # Not a chat body: no `stream_options` added to the copy, and its usage comes anyway.
    assert "stream_options" not in json.loads(shadow.request_body)
    assert shadow.token_counts()["completion"] > 0
    assembled = assemble_messages(shadow.body())
    assert shadow.stream
    assert assembled is not None
    assert assembled["content"][0]["text"]


def _tool_round_trip(
    client: anthropic.Anthropic, opening: str, stream: bool
) -> tuple[list[str], list[Any]]:
    """Two turns: the model calls the tool, the client answers with its result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": opening}]
    backends, stops = [], []
    for _turn in (1, 2):
        if stream:
            with client.messages.stream(
                model=CLAUDE, max_tokens=64, tools=[WEATHER], messages=messages
            ) as events:
                message = events.get_final_message()
                backends.append(events.response.headers["x-kvmigrate-backend"])
        else:
            raw = client.messages.with_raw_response.create(
                model=CLAUDE, max_tokens=64, tools=[WEATHER], messages=messages
            )
            message = raw.parse()
            backends.append(raw.headers["x-kvmigrate-backend"])
        stops.append(message.stop_reason)
        messages.append({"role": "assistant", "content": message.content})
        uses = [b for b in message.content if b.type == "tool_use"]
        results = [
            {"type": "tool_result", "tool_use_id": u.id, "content": "sunny, 21C"} for u in uses
        ]
        messages.append({"role": "user", "content": results or "thanks"})
    return backends, stops


@pytest.mark.parametrize("stream", [False, True])
def test_split_half_keeps_every_turn_of_a_conversation_on_one_backend(
    make_proxy: MessagesProxyFactory, stream: bool
) -> None:
    proxy = make_proxy(rollout="{mode: split, percent: 50, shadow_sample: 0, noise_sample: 0}")
    client = proxy.client()
    by_conversation = {}
    for n in range(12):
        backends, stops = _tool_round_trip(client, f"What is the weather in city {n}?", stream)
        assert stops[0] == "tool_use"  # the tool call, then an answer to its result
        assert stops[1] in ("end_turn", "max_tokens")
        by_conversation[n] = backends
    assert all(len(set(b)) == 1 for b in by_conversation.values()), by_conversation
    assert {b[0] for b in by_conversation.values()} == {"hosted", "vllm"}
    served = [e for e in proxy.exchanges.wait(24) if e.role == "serve"]
    assert all(e.route == "messages" and e.status == 200 for e in served)
    # Turn 2 resends turn 1's answer: continuity names its conversation and turn.
    assert {e.turn for e in served} == {1, 2}
    assert {e.identity for e in served if e.turn == 2} == {"continuity"}


def test_conversation_declared_by_metadata_user_id(make_proxy: MessagesProxyFactory) -> None:
    proxy = make_proxy()
    proxy.client().messages.create(**ask("hello", metadata={"user_id": "agent-7"}))
    serve = next(e for e in proxy.exchanges.wait(1) if e.role == "serve")
    assert (serve.conversation, serve.identity) == ("user:agent-7", "user")


def test_count_tokens_goes_to_the_conversations_backend(make_proxy: MessagesProxyFactory) -> None:
    proxy = make_proxy()
    counted = proxy.client().messages.count_tokens(
        model=CLAUDE, messages=[{"role": "user", "content": "How many tokens is this?"}]
    )
    assert counted.input_tokens > 0
    serve = next(e for e in proxy.exchanges.wait(1) if e.role == "serve")
    assert (serve.route, serve.backend) == ("messages/count_tokens", "hosted")


def test_unknown_model_raises_not_found(make_proxy: MessagesProxyFactory) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        make_proxy().client().messages.create(**ask("x", model="claude-unknown"))
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": caught.value.body["error"]["message"]},
    }


def test_bad_key_raises_authentication_error_and_x_api_key_is_accepted(
    make_proxy: MessagesProxyFactory,
) -> None:
    master = "sk-kvmigrate-master"
    proxy = make_proxy(extra=f"server: {{master_key: {master}}}", primary_extra=", api_key: x")
    with pytest.raises(anthropic.AuthenticationError) as caught:
        proxy.client(api_key="sk-wrong").messages.create(**ask("x"))
    assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    # The raw header the Claude Code CLI and older SDKs send.
    with pytest.raises(anthropic.AuthenticationError):
        proxy.client(api_key=None, default_headers={"x-api-key": "sk-wrong"}).messages.create(
            **ask("x")
        )


def test_x_api_key_reaches_the_primary_as_the_client_sent_it(
    make_proxy: MessagesProxyFactory,
) -> None:
    client = make_proxy().client(api_key=None, default_headers={"x-api-key": CLIENT_KEY})
    assert client.messages.create(**ask("hello")).content  # the primary checks this key


def test_oversized_body_raises_request_too_large(make_proxy: MessagesProxyFactory) -> None:
    proxy = make_proxy(extra="server: {max_body_bytes: 4096}")
    with pytest.raises(anthropic.RequestTooLargeError) as caught:
        proxy.client().messages.create(**ask("x" * 10_000))
    assert caught.value.status_code == 413
    assert caught.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]


def test_malformed_body_is_an_anthropic_invalid_request(make_proxy: MessagesProxyFactory) -> None:
    host, port = make_proxy().server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/messages", b"{not json", {"Content-Type": "application/json"})
    response = conn.getresponse()
    body = json.loads(response.read())
    conn.close()
    assert response.status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"


def test_a_stream_that_breaks_ends_with_an_anthropic_error_event(
    make_proxy: MessagesProxyFactory,
) -> None:
    proxy = make_proxy(
        rollout="{mode: split, percent: 100, noise_sample: 0}", candidate_extra=FAULTS_ALLOWED
    )
    client = proxy.client(default_headers={"x-emulator-fault": "disconnect"})
    texts = []
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        client.messages.stream(**ask("A long story about ships")) as stream,
    ):
        texts.extend(stream.text_stream)
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    serve = next(e for e in proxy.exchanges.wait(1) if e.role == "serve")
    assert serve.backend == "vllm"
    assert serve.error == "stream_broken"


def test_candidate_failure_before_the_first_byte_falls_back(
    make_proxy: MessagesProxyFactory,
) -> None:
    proxy = make_proxy(
        rollout="{mode: split, percent: 100, noise_sample: 0}", candidate_extra=FAULTS_ALLOWED
    )
    client = proxy.client(default_headers={"x-emulator-fault": "vllm:500"})
    raw = client.messages.with_raw_response.create(**ask("hello"))
    assert raw.headers["x-kvmigrate-backend"] == "hosted"
    assert raw.parse().id.startswith("msg_")


@pytest.mark.parametrize("fallback", [False, True])
def test_candidate_errors_reach_the_client_in_anthropics_envelope(
    make_proxy: MessagesProxyFactory, fallback: bool
) -> None:
    """vLLM names its error type after its exception class; the client gets Anthropic's.
    With a fallback the primary is asked too, and refuses as well: its own error."""
    rollout = f"{{mode: split, percent: 100, noise_sample: 0, fallback: {str(fallback).lower()}}}"
    proxy = make_proxy(rollout=rollout)
    with pytest.raises(anthropic.BadRequestError) as caught:
        proxy.client().messages.create(**ask("x", extra_body={"temperature": 1.5}))
    assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    serves = [e for e in proxy.exchanges.wait(1 + fallback) if e.role == "serve"]
    assert [(e.backend, e.status, e.error) for e in serves] == [
        ("vllm", 400, None),  # refused by both: the request's fault, not the candidate's
        *([("hosted", 400, None)] if fallback else []),
    ]
    assert b"BadRequestError" in serves[0].body()  # the record keeps vLLM's own bytes


def test_the_clients_anthropic_key_never_reaches_the_candidate(
    make_proxy: MessagesProxyFactory,
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kvmigrate.recorder import build_recorder

    upstream, seen = recording_upstream
    db = tmp_path / "records.db"
    config = messages_config(
        "http://unused", upstream.url, extra=f"record: {{db: 'sqlite:///{db}', content: full}}"
    )
    recorder = build_recorder(config)
    proxy = make_proxy(
        candidate_url=upstream.url,
        addons=(recorder,),
        extra=f"record: {{db: 'sqlite:///{db}', content: full}}",
    )
    caplog.set_level(logging.DEBUG)
    client = proxy.client(default_headers={"x-api-key": CLIENT_KEY, "anthropic-beta": "b-1"})
    assert client.messages.create(**ask("hello")).content
    proxy.exchanges.wait(2)
    shadow = seen[0]
    assert shadow.path == "/v1/messages"
    assert json.loads(shadow.body)["model"] == VLLM_MODEL
    assert CLIENT_KEY not in json.dumps(shadow.headers)
    lowered = {k.lower(): v for k, v in shadow.headers.items()}
    assert lowered["anthropic-version"]
    assert lowered["anthropic-beta"] == "b-1"
    proxy.server.stop()  # the recorder writes what it holds as the proxy stops
    assert CLIENT_KEY.encode() not in db.read_bytes()
    assert CLIENT_KEY not in caplog.text


def test_a_model_on_an_anthropic_backend_cannot_also_map_to_azure() -> None:
    text = """
backends:
  hosted: {type: anthropic, api_base: "https://api.anthropic.com/v1"}
  az: {type: azure, api_base: "https://x.openai.azure.com", api_version: "2024-10-21"}
models:
  - {model_name: claude, hosted: claude-sonnet-4-5, az: gpt-4o}
rollout: {primary: hosted, candidate: az}
"""
    with pytest.raises(ConfigError, match="cannot serve Anthropic's Messages API"):
        parse_config(text, env={})


def test_a_messages_request_for_a_model_an_azure_backend_serves_is_refused(
    emulators: tuple[BackgroundServer, BackgroundServer],
) -> None:
    """Not translated to chat completions behind the client's back: a clear 400."""
    hosted, vllm = emulators
    config = parse_config(
        f"""
backends:
  vllm: {{api_base: "{vllm.url}/v1"}}
  az: {{type: azure, api_base: "{hosted.url}", api_version: "2024-10-21"}}
models:
  - {{model_name: {CLAUDE}, vllm: {VLLM_MODEL}, az: gpt-4o}}
rollout: {{primary: vllm, candidate: az}}
""",
        env={},
    )
    with BackgroundServer(lambda: build_proxy_app(config)) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="never translates"):
            client.messages.create(**ask("x"))
        client.close()


def test_an_anthropic_backend_gets_its_own_key_in_x_api_key(
    recording_upstream: tuple[BackgroundServer, list[Recorded]],
) -> None:
    """The backend's key replaces the client's, in the header Anthropic reads; the
    client's anthropic-version and anthropic-beta pass through."""
    upstream, seen = recording_upstream
    config = messages_config(upstream.url, upstream.url, primary_extra=", api_key: sk-ant-org-key")
    with BackgroundServer(lambda: build_proxy_app(config)) as server:
        client = anthropic.Anthropic(
            base_url=server.url,
            api_key=CLIENT_KEY,
            max_retries=0,
            default_headers={"anthropic-beta": "tools-2024"},
        )
        raw = client.messages.with_raw_response.create(**ask("hello"))
        assert raw.status_code == 200
        client.close()
    primary = next(r for r in seen if json.loads(r.body)["model"] == CLAUDE)
    headers = {k.lower(): v for k, v in primary.headers.items()}
    assert headers["x-api-key"] == "sk-ant-org-key"
    assert "authorization" not in headers
    assert headers["anthropic-beta"] == "tools-2024"
    assert headers["anthropic-version"]


def test_a_chat_request_for_a_model_on_an_anthropic_backend_is_refused(
    make_proxy: MessagesProxyFactory,
) -> None:
    import openai

    proxy = make_proxy()
    with (
        openai.OpenAI(base_url=proxy.server.url + "/v1", api_key="k", max_retries=0) as client,
        pytest.raises(openai.BadRequestError) as caught,
    ):
        client.chat.completions.create(model=CLAUDE, messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "unsupported_route"


def test_metrics_count_messages_by_route_with_anthropic_token_counts(
    make_proxy: MessagesProxyFactory,
) -> None:
    import urllib.request

    proxy = make_proxy()
    proxy.client().messages.create(**ask("hello", system="Be brief."))
    proxy.exchanges.wait(2)
    text = urllib.request.urlopen(proxy.server.url + "/metrics", timeout=5).read().decode()
    # Labels in name order; the cohort is the model's own (the config names none).
    served = f'backend="hosted",cohort="{CLAUDE}",role="serve",route="messages",status="200"'
    assert f"kvmigrate_requests_total{{{served}}} 1.0" in text
    shadow = f'backend="vllm",cohort="{CLAUDE}",role="shadow",route="messages"'
    assert f"kvmigrate_requests_total{{{shadow}" in text
    # Anthropic's usage read as prompt (input + cache reads + writes) and completion tokens.
    assert 'kvmigrate_tokens_total{backend="hosted",kind="prompt",role="serve"}' in text


def test_the_anthropic_sdk_lists_the_proxys_models(make_proxy: MessagesProxyFactory) -> None:
    models = make_proxy().client().models.list()
    assert [m.id for m in models.data] == [CLAUDE]
    assert models.data[0].type == "model"


def test_the_anthropic_sdk_retrieves_a_model_in_anthropic_s_shape(
    make_proxy: MessagesProxyFactory,
) -> None:
    model = make_proxy().client().models.retrieve(CLAUDE)
    assert (model.id, model.type, model.display_name) == (CLAUDE, "model", CLAUDE)
    assert model.created_at.year == 1970
    assert not model.model_extra  # no OpenAI fields (`object`, `owned_by`) beside them
