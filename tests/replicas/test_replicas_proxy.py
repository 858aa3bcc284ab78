"""Replica routing through the real proxy: stickiness, in-flight accounting, failure, recovery.

Three emulated vLLM replicas behind one proxy in split mode (the candidate answers every
conversation). Which replica served a request is read from each replica's own /metrics.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from kvmigrate.bench.fleet import counter
from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.proxy.app import SERVICE_KEY
from kvmigrate.proxy.replicas import ReplicaSet
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"


def _replica_app() -> object:
    return build_app(EmulatorSettings(profile="vllm", time_scale=0))


@dataclass
class Fleet:
    replicas: list[BackgroundServer]
    hosted: BackgroundServer
    proxy: BackgroundServer

    @property
    def replica_set(self) -> ReplicaSet:
        return self.proxy.app[SERVICE_KEY].upstreams["vllm"].replicas

    def served(self) -> list[float]:
        """Finished requests per replica (0 for a stopped one)."""
        counts = []
        for server in self.replicas:
            try:
                with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                counts.append(0.0)
                continue
            counts.append(counter(text, "vllm:request_success_total"))
        return counts

    def index(self, conversation: str) -> int:
        """The replica a conversation was placed on (by its first turn)."""
        base = self.replica_set.assigned(conversation)
        assert base is not None, conversation
        return self.replica_set.bases.index(base)


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    replicas = [BackgroundServer(_replica_app).start() for _ in range(3)]
    hosted = BackgroundServer(
        lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0))
    ).start()
    bases = ", ".join(f'"{r.url}/v1"' for r in replicas)
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: [{bases}], connect_timeout: 1, read_timeout: 5}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: split, percent: 100}}
""",
        env={},
    )
    proxy = BackgroundServer(lambda: build_proxy_app(config)).start()
    fleet = Fleet(replicas, hosted, proxy)
    fleet.replica_set.probe_interval_s = 0.1
    yield fleet
    proxy.stop()
    hosted.stop()
    for replica in replicas:
        replica.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fleet.proxy.url + "/v1", api_key="k", max_retries=0) as sdk:
        yield sdk


def turn(client: openai.OpenAI, conversation: str, stream: bool = False) -> str:
    headers = {"X-Session-ID": conversation}
    messages: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": f"hello from {conversation}"}
    ]
    if stream:
        chunks = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=8, stream=True, extra_headers=headers
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, extra_headers=headers
    )
    return answer.choices[0].message.content or ""


def start_conversations(
    fleet: Fleet, client: openai.OpenAI, per_replica: int = 2
) -> dict[int, list[str]]:
    """Open conversations (one turn each) until every replica holds `per_replica`."""
    found: dict[int, list[str]] = {0: [], 1: [], 2: []}
    i = 0
    while min(len(v) for v in found.values()) < per_replica:
        key = f"conv-{i}"
        turn(client, key)
        found[fleet.index(key)].append(key)
        i += 1
    return found


def test_every_turn_of_a_conversation_reaches_its_home_replica(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    for conversations in start_conversations(fleet, client).values():
        for key in conversations:
            before = fleet.served()
            for _ in range(4):
                turn(client, key, stream=key.endswith(("1", "3", "5")))
            after = fleet.served()
            delta = [a - b for a, b in zip(after, before, strict=True)]
            assert delta[fleet.index(key)] == 4, (key, delta)
            assert sum(delta) == 4


def test_in_flight_counts_return_to_zero(fleet: Fleet, client: openai.OpenAI) -> None:
    for i in range(12):
        turn(client, f"c{i}", stream=i % 2 == 0)
    # A response is released once the client has it all; give the proxy a moment to finish
    # (a generous deadline: beside a CPU hog that moment can take seconds).
    deadline = time.monotonic() + 60
    while fleet.replica_set.loads != [0, 0, 0] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fleet.replica_set.loads == [0, 0, 0]
    assert sum(fleet.replica_set.sessions) == 12


def test_a_failed_replica_moves_only_its_conversations_and_comes_back(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    placed = start_conversations(fleet, client)
    victim = 1
    port = fleet.replicas[victim].port
    fleet.replicas[victim].stop()

    # The next turn of a victim conversation still gets an answer (fallback to the primary),
    # and the replica is out of rotation from then on.
    assert turn(client, placed[victim][0])
    assert fleet.replica_set.healthy == [True, False, True]

    before = fleet.served()
    for conversations in placed.values():
        for key in conversations:
            turn(client, key)
    delta = [a - b for a, b in zip(fleet.served(), before, strict=True)]
    # the survivors' conversations stayed; the victim's two moved to the survivors
    assert delta[victim] == 0
    assert delta[0] >= len(placed[0])
    assert delta[2] >= len(placed[2])
    assert sum(delta) == sum(len(v) for v in placed.values())

    # Back on the same port: the health probe marks it up, and new conversations reach it
    # (it holds none now, so the load bound sends the next newcomers there).
    fleet.replicas[victim] = BackgroundServer(_replica_app, port=port).start()
    deadline = time.monotonic() + 10
    while not fleet.replica_set.healthy[victim] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fleet.replica_set.healthy == [True, True, True]
    # Which replica a newcomer hashes to depends on its key; over nine of them the load
    # bound must send a fair share to the empty, recovered replica (none while it is down).
    before = fleet.served()
    for i in range(9):
        turn(client, f"new-{i}")
    delta = [a - b for a, b in zip(fleet.served(), before, strict=True)]
    assert delta[victim] >= 2
    # The moved conversations stay where their prefix is now cached.
    moved = placed[victim][0]
    before = fleet.served()
    turn(client, moved)
    delta = [a - b for a, b in zip(fleet.served(), before, strict=True)]
    assert delta[victim] == 0
    assert sum(delta) == 1
