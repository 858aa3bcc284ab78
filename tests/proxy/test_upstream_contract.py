"""What each upstream received, exactly, on every OpenAI route, in every key mode and both
rollout modes: the header set (each allowed name has its reason in edge_contracts), the key
in it, the query, and no secret where it does not belong.

Before these tests the suite checked where a request went, and a route that sent the
client's hosted key to the self-hosted candidate would have passed. Here a real SDK client
talks to a real proxy in front of two real emulators that note each request as it arrived.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

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
EMBEDDING = "text-embedding-3-small"
USER = [{"role": "user", "content": "hello there"}]
OWN_KEY = ("authorization", "Bearer " + PRIMARY_KEY)


@dataclass(frozen=True)
class Route:
    """One client call; `path`, the route every upstream call it makes is on;
    `before`: a call made first (not under test), whose result the call takes."""

    name: str
    path: str
    call: Callable[[openai.OpenAI, Any], object]
    before: Callable[[openai.OpenAI], Any] | None = None
    method: str = "POST"
    copied: bool = True  # whether a shadow copy goes to the candidate


def _chat(client: openai.OpenAI, _: Any) -> object:
    return client.chat.completions.create(model="gpt-4o-mini", messages=USER)  # type: ignore[arg-type]


def _chat_stream(client: openai.OpenAI, _: Any) -> object:
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=USER, stream=True)  # type: ignore[arg-type]
    return [chunk for chunk in stream]


def _completion(client: openai.OpenAI, _: Any) -> object:
    return client.completions.create(model="gpt-4o-mini", prompt="hello there")


def _response(client: openai.OpenAI, _: Any) -> object:
    return client.responses.create(model="gpt-4o-mini", input="hello there")


def _response_get(client: openai.OpenAI, created: Any) -> object:
    return client.responses.retrieve(created.id)


def _embedding(client: openai.OpenAI, _: Any) -> object:
    return client.embeddings.create(model=EMBEDDING, input="hello there")


def _created(client: openai.OpenAI) -> Any:
    return client.responses.create(model="gpt-4o-mini", input="hello there")


ROUTES = (
    Route("chat", "/v1/chat/completions", _chat),
    Route("chat-stream", "/v1/chat/completions", _chat_stream),
    Route("completions", "/v1/completions", _completion),
    Route("responses", "/v1/responses", _response),
    Route("responses-get", "/v1/responses/{id}", _response_get, _created, "GET", copied=False),
    Route("embeddings", "/v1/embeddings", _embedding),
)
ROLLOUTS = {
    "shadow": "{mode: shadow, shadow_sample: 1.0, noise_sample: 0}",
    "split": "{mode: split, percent: 100, shadow_sample: 0, noise_sample: 0, fallback: false}",
}


@pytest.fixture(scope="module")
def bed() -> Iterator[tuple[dict[str, BackgroundServer], Recorder]]:
    settings = {
        "hosted": EmulatorSettings("hosted", time_scale=0, models=("gpt-4o-mini", EMBEDDING)),
        "vllm": EmulatorSettings("vllm", time_scale=0, models=(CANDIDATE_MODEL, EMBEDDING)),
    }
    with recording_emulators(settings) as running:
        yield running


@pytest.fixture
def start_proxy(
    bed: tuple[dict[str, BackgroundServer], Recorder],
) -> Iterator[Callable[[Auth, str], openai.OpenAI]]:
    servers, recorder = bed
    started: list[tuple[BackgroundServer, openai.OpenAI]] = []

    def start(auth: Auth, rollout: str) -> openai.OpenAI:
        recorder.calls.clear()
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{servers["hosted"].url}/v1", read_timeout: 10 {auth.primary_extra()}}}
  vllm: {{api_base: "{servers["vllm"].url}/v1", read_timeout: 10 {auth.candidate_extra()}}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {CANDIDATE_MODEL}}}
  - {{model_name: {EMBEDDING}, hosted: {EMBEDDING}, vllm: {EMBEDDING}}}
rollout: {ROLLOUTS[rollout]}
{auth.server()}
""",
            env={},
        )
        proxy = BackgroundServer(lambda: build_proxy_app(config)).start()
        client = openai.OpenAI(
            base_url=proxy.url + "/v1",
            api_key=auth.client_key,
            max_retries=0,
            default_headers=CLIENT_HEADERS,
            default_query=CLIENT_QUERY,
        )
        started.append((proxy, client))
        return client

    yield start
    for proxy, client in started:
        client.close()
        proxy.stop()


def sent_names(bed: tuple[dict[str, BackgroundServer], Recorder], route: Route) -> set[str]:
    """The header names the client sends on `route`, as an upstream receives them when
    the client calls it directly: the SDK's own and CLIENT_HEADERS."""
    servers, recorder = bed
    recorder.calls.clear()
    with openai.OpenAI(
        base_url=servers["hosted"].url + "/v1",
        api_key="sk-calibration",
        max_retries=0,
        default_headers=CLIENT_HEADERS,
        default_query=CLIENT_QUERY,
    ) as direct:
        route.call(direct, route.before(direct) if route.before else None)
    names = recorder.calls[-1].names - {"host", "content-length", "accept-encoding"}
    recorder.calls.clear()
    return names


def test_the_client_really_sends_every_header_of_the_table(
    bed: tuple[dict[str, BackgroundServer], Recorder],
) -> None:
    """Calibration: an upstream that lacks a hop-by-hop header lacks it because the proxy
    dropped it, not because the client never sent it."""
    names = sent_names(bed, ROUTES[0])
    assert {n.lower() for n in CLIENT_HEADERS} | {"authorization"} <= names


def expected_calls(route: Route, rollout: str, auth: Auth) -> list[tuple[str, str, str]]:
    """(role, method, path) of each upstream call, in order."""
    path = route.path
    if rollout == "shadow":
        copy = [("candidate", route.method, path)] if route.copied else []
        return [("primary", route.method, path), *copy]
    # The candidate serves; a passed-through key is asked about first, once (a GET after
    # its create finds the verdict kept).
    check = auth.mode is Mode.PASS_THROUGH and route.before is None
    return [("key_check", "GET", "/v1/models")] * check + [("candidate", route.method, path)]


@pytest.mark.parametrize("rollout", ROLLOUTS)
@pytest.mark.parametrize("auth", AUTHS, ids=str)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_each_upstream_receives_exactly_its_share(
    bed: tuple[dict[str, BackgroundServer], Recorder],
    start_proxy: Callable[[Auth, str], openai.OpenAI],
    route: Route,
    auth: Auth,
    rollout: str,
) -> None:
    sent = sent_names(bed, route)
    client = start_proxy(auth, rollout)
    _, recorder = bed
    made = route.before(client) if route.before else None
    if route.before:
        want_before = 1 if rollout == "shadow" or auth.mode is not Mode.PASS_THROUGH else 2
        recorder.wait(want_before + (rollout == "shadow"))
        recorder.calls.clear()
    route.call(client, made)
    expected = expected_calls(route, rollout, auth)
    calls = recorder.wait(len(expected))
    roles = {"primary": "hosted", "key_check": "hosted", "candidate": "vllm"}
    assert [(c.upstream, c.method, _templated(c.route, made)) for c in calls] == [
        (roles[role], method, path) for role, method, path in expected
    ]
    for call, (role, _, _) in zip(calls, expected, strict=True):
        assert_call_keeps_the_contract(call, sent, role, auth, OWN_KEY)


def _templated(path: str, made: Any) -> str:
    return path.replace(made.id, "{id}") if made is not None else path


@pytest.mark.parametrize("auth", AUTHS, ids=str)
def test_the_model_list_is_the_proxys_own_and_a_model_it_does_not_know_goes_to_the_primary(
    bed: tuple[dict[str, BackgroundServer], Recorder],
    start_proxy: Callable[[Auth, str], openai.OpenAI],
    auth: Auth,
) -> None:
    sent = sent_names(bed, ROUTES[0]) - {"content-type"}
    client = start_proxy(auth, "split")
    _, recorder = bed
    assert {m.id for m in client.models.list()} == {"gpt-4o-mini", EMBEDDING}
    assert recorder.calls == []  # answered by the proxy: no upstream asked
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    calls = recorder.wait(1)
    assert [(c.upstream, c.method, c.route) for c in calls] == [
        ("hosted", "GET", "/v1/models/no-such-model")
    ]
    assert_call_keeps_the_contract(calls[0], sent, "primary", auth, OWN_KEY)


def test_every_route_of_the_table_is_a_model_route() -> None:
    """The table covers each model route the proxy serves on the OpenAI wire (the
    Messages routes: test_upstream_contract_kinds.py)."""
    from kvmigrate.proxy.paths import MODEL_ROUTES

    covered = {r.path.removeprefix("/v1/") for r in ROUTES if r.method == "POST"}
    assert covered == set(MODEL_ROUTES) - {"messages", "messages/count_tokens"}
