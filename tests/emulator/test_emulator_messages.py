"""The Messages API as the emulator speaks it: Anthropic's hosted wire on the anthropic
profile (prompt caching only up to `cache_control` breakpoints), vLLM 0.32's on the vllm one."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import pytest
from emulator_support import StartEmulator, raw

from kvmigrate.emulator.breakpoint_cache import BreakpointCache, Breakpoints
from kvmigrate.serving import BackgroundServer

CLAUDE = "claude-sonnet-4-5"
VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG_SYSTEM = "You are a careful travel agent who checks every booking twice. " * 40
HEADERS = {"anthropic-version": "2023-06-01"}


MakeSdk = Callable[[BackgroundServer], anthropic.Anthropic]


@pytest.fixture
def sdk() -> Iterator[MakeSdk]:
    """Anthropic SDK clients, closed after the test: a client left to the garbage collector
    frees its socket whenever the cycle collector next runs, failing a later test on a
    ResourceWarning."""
    clients: list[anthropic.Anthropic] = []

    def make(server: BackgroundServer) -> anthropic.Anthropic:
        client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0, timeout=10)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def cached_system(marked: bool = True) -> list[dict[str, Any]]:
    block: dict[str, Any] = {"type": "text", "text": LONG_SYSTEM}
    if marked:
        block["cache_control"] = {"type": "ephemeral"}
    return [block]


def events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE event."""
    found = []
    for frame in body.decode().strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        found.append((lines["event"], json.loads(lines["data"])))
    return found


def test_a_breakpoint_writes_the_prefix_then_reads_it(
    start_emulator: StartEmulator, sdk: MakeSdk
) -> None:
    client = sdk(start_emulator("anthropic", cache_min_tokens=256))
    ask = {"model": CLAUDE, "max_tokens": 20, "system": cached_system()}
    first = client.messages.create(**ask, messages=[{"role": "user", "content": "Rome?"}])
    second = client.messages.create(**ask, messages=[{"role": "user", "content": "Oslo?"}])
    written = first.usage.cache_creation_input_tokens
    assert written is not None
    assert written > 256
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == written
    assert second.usage.cache_creation_input_tokens == 0
    # input_tokens is what follows the last breakpoint: the question, not the system prompt.
    assert 0 < second.usage.input_tokens < 30


def test_without_a_breakpoint_nothing_is_cached(
    start_emulator: StartEmulator, sdk: MakeSdk
) -> None:
    client = sdk(start_emulator("anthropic", cache_min_tokens=256))
    ask = {"model": CLAUDE, "max_tokens": 20, "system": cached_system(marked=False)}
    for _ in range(2):
        usage = client.messages.create(**ask, messages=[{"role": "user", "content": "Rome?"}]).usage
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


def test_a_prefix_below_the_minimum_is_not_cached(
    start_emulator: StartEmulator, sdk: MakeSdk
) -> None:
    client = sdk(start_emulator("anthropic", cache_min_tokens=100_000))
    ask = {"model": CLAUDE, "max_tokens": 20, "system": cached_system()}
    for _ in range(2):
        usage = client.messages.create(**ask, messages=[{"role": "user", "content": "Rome?"}]).usage
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


def test_a_breakpoint_moved_to_the_newest_turn_reads_the_last_turns_prefix() -> None:
    """Anthropic's lookback: a hit at a block boundary before the breakpoint counts."""
    cache = BreakpointCache(min_tokens=4, capacity_tokens=10_000, ttl_s=300)
    turn1 = [f"t{i}" for i in range(30)]
    turn2 = [*turn1, *(f"u{i}" for i in range(20))]
    first = cache.lookup_and_insert(turn1, Breakpoints((10, 30), frozenset({30})))
    second = cache.lookup_and_insert(turn2, Breakpoints((10, 30, 50), frozenset({50})))
    assert (first.read, first.written) == (0, 30)
    assert (second.read, second.written) == (30, 20)
    # A changed early block changes every later prefix: nothing to read.
    edited = ["X", *turn2[1:]]
    third = cache.lookup_and_insert(edited, Breakpoints((10, 30, 50), frozenset({50})))
    assert third.read == 0


def test_cache_entries_expire() -> None:
    now = [0.0]
    cache = BreakpointCache(min_tokens=1, capacity_tokens=100, ttl_s=300, clock=lambda: now[0])
    tokens, points = list("abcdefgh"), Breakpoints((8,), frozenset({8}))
    cache.lookup_and_insert(tokens, points)
    now[0] = 301.0
    assert cache.lookup_and_insert(tokens, points).read == 0


def test_hosted_stream_events_in_order(start_emulator: StartEmulator) -> None:
    server = start_emulator("anthropic")
    body = {"model": CLAUDE, "max_tokens": 30, "stream": True}
    body["messages"] = [{"role": "user", "content": "hi"}]
    status, headers, data = raw(server, "POST", "/v1/messages", body, HEADERS)
    assert status == 200
    assert headers["Content-Type"].startswith("text/event-stream")
    names = [name for name, _ in events(data)]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    found = dict(events(data)[:1])
    start = found["message_start"]["message"]
    assert start["id"].startswith("msg_01")
    assert set(start["usage"]) >= {"cache_creation_input_tokens", "cache_read_input_tokens"}
    assert all(name == data["type"] for name, data in events(data))


def test_tool_use_streams_input_json_deltas(start_emulator: StartEmulator, sdk: MakeSdk) -> None:
    client = sdk(start_emulator("anthropic"))
    tool = {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    kinds = []
    with client.messages.stream(
        model=CLAUDE,
        max_tokens=50,
        tools=[tool],
        messages=[{"role": "user", "content": "Weather in Lima?"}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.append(event.delta.type)
        message = stream.get_final_message()
    assert set(kinds) == {"input_json_delta"}
    use = message.content[0]
    assert use.type == "tool_use"
    assert use.id.startswith("toolu_01")
    assert use.name == "get_weather"
    assert isinstance(use.input, dict)
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("headers", "status", "kind"),
    [
        ({"x-api-key": "wrong", **HEADERS}, 401, "authentication_error"),
        ({"x-api-key": "right"}, 400, "invalid_request_error"),  # no anthropic-version
    ],
)
def test_hosted_errors_in_anthropics_envelope(
    start_emulator: StartEmulator, headers: dict[str, str], status: int, kind: str
) -> None:
    server = start_emulator("anthropic", api_key="right")
    body = {"model": CLAUDE, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    got, _, data = raw(server, "POST", "/v1/messages", body, headers)
    error = json.loads(data)
    assert got == status
    assert error["type"] == "error"
    assert error["error"]["type"] == kind
    assert error["request_id"].startswith("req_")


def test_max_tokens_is_required(start_emulator: StartEmulator) -> None:
    server = start_emulator("anthropic")
    body = {"model": CLAUDE, "messages": [{"role": "user", "content": "x"}]}
    status, _, data = raw(server, "POST", "/v1/messages", body, HEADERS)
    assert status == 400
    assert json.loads(data)["error"]["message"] == "max_tokens: Field required"


def test_anthropic_profile_serves_no_chat_completions(start_emulator: StartEmulator) -> None:
    status, _, _ = raw(start_emulator("anthropic"), "POST", "/v1/chat/completions", {}, HEADERS)
    assert status == 404


def test_vllm_messages_wire(start_emulator: StartEmulator) -> None:
    """vLLM 0.32: chat ids, null fields left out, no ping, all counts in message_delta."""
    server = start_emulator("vllm")
    body: dict[str, Any] = {"model": VLLM_MODEL, "max_tokens": 30, "system": LONG_SYSTEM}
    body["messages"] = [{"role": "user", "content": "hi"}]
    status, _, data = raw(server, "POST", "/v1/messages", body)
    whole = json.loads(data)
    assert status == 200
    assert whole["id"].startswith("chatcmpl-")
    assert "stop_sequence" not in whole
    assert "cache_read_input_tokens" in whole["usage"]
    status, _, data = raw(server, "POST", "/v1/messages", {**body, "stream": True})
    found = events(data)
    names = [name for name, _ in found]
    assert "ping" not in names
    assert names[0] == "message_start"
    assert names[-1] == "message_stop"
    delta = dict(found)["message_delta"]
    assert delta["usage"]["cache_read_input_tokens"] > 0  # the whole call ran just before
    assert delta["usage"]["output_tokens"] > 0


def test_vllm_messages_errors_name_the_exception_class(start_emulator: StartEmulator) -> None:
    body = {"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    status, _, data = raw(start_emulator("vllm"), "POST", "/v1/messages", body)
    assert status == 404
    assert json.loads(data) == {
        "type": "error",
        "error": {"type": "NotFoundError", "message": "The model `nope` does not exist."},
    }


@pytest.mark.parametrize("profile", ["anthropic", "vllm"])
def test_count_tokens_matches_the_prompt_the_answer_reports(
    start_emulator: StartEmulator,
    profile: str,
    sdk: MakeSdk,
) -> None:
    server = start_emulator(profile)
    model = CLAUDE if profile == "anthropic" else VLLM_MODEL
    client = sdk(server)
    messages: Any = [{"role": "user", "content": "Count these words for me"}]
    counted = client.messages.count_tokens(model=model, messages=messages)
    usage = client.messages.create(model=model, max_tokens=5, messages=messages).usage
    cache = (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    # Anthropic's total input: what was read from, written to and left out of the cache.
    assert counted.input_tokens == usage.input_tokens + cache
