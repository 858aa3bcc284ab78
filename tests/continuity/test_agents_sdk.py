"""The openai-agents SDK through the proxy (issue 17): a multi-turn, tool-using agent, run
with `auto_previous_response_id=True` (a server-side chain) and in the SDK's default
stateless mode (the whole history resent), at a 50% split. Every run stays on one backend,
and the records count its turns. Real proxy, real emulators, the real agents SDK.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import agents  # openai-agents, from the `test` extra
import openai
import pytest

from kvmigrate.config import Config
from kvmigrate.recorder.store import open_store as open_record_store
from kvmigrate.report.build import build_report
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
RUNS = 8
USER_TURNS = 3


@pytest.fixture
def config(config_for: Callable[..., Config]) -> Config:
    return config_for("mode: split, percent: 50")


@agents.function_tool
def get_weather(city: str) -> str:
    """Get the current weather forecast for a city."""
    return f"Sunny and 21C in {city}."


async def run_agent(client: openai.AsyncOpenAI, number: int, chained: bool) -> None:
    """USER_TURNS user turns, each asking for weather: the model calls the tool, the SDK
    sends its result, the model answers."""
    agent = agents.Agent(
        name=f"travel-{number}",
        instructions="You are a concise travel assistant.",
        tools=[get_weather],
        model=agents.OpenAIResponsesModel(MODEL, client),
    )
    history: list[Any] = []
    previous: str | None = None
    calls = 0
    for turn in range(1, USER_TURNS + 1):
        question = f"Agent {number}: what is the weather forecast in city {turn}?"
        if chained:
            result = await agents.Runner.run(
                agent, question, previous_response_id=previous, auto_previous_response_id=True
            )
            previous = result.last_response_id
        else:
            result = await agents.Runner.run(
                agent, [*history, {"role": "user", "content": question}]
            )
            history = result.to_input_list()
        calls += sum(isinstance(item, agents.ToolCallItem) for item in result.new_items)
        assert result.final_output
    assert calls == USER_TURNS  # each turn used the tool


async def run_all(url: str, chained: bool) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0)
    try:
        await asyncio.gather(*(run_agent(client, n, chained) for n in range(RUNS)))
    finally:
        await client.close()


@pytest.mark.parametrize("chained", [True, False], ids=["auto_previous_response_id", "stateless"])
def test_agent_runs_stay_on_one_backend_with_their_turns_counted(
    config: Config, chained: bool
) -> None:
    agents.set_tracing_disabled(True)
    proxy = BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()
    try:
        asyncio.run(run_all(proxy.url, chained))
    finally:
        proxy.stop()
    store = open_record_store(config.record.db)
    try:
        rows = store.query(
            "SELECT conversation, turn, backend, status FROM records "
            "WHERE role = 'serve' AND route = 'responses'",
            (),
        )
        report = build_report(store, since=0)
    finally:
        store.close()
    runs: dict[str, list[tuple[int, str, int]]] = defaultdict(list)
    for conversation, turn, backend, status in rows:
        runs[str(conversation)].append((int(turn), str(backend), int(status)))
    assert len(runs) == RUNS
    requests = USER_TURNS * 2  # a tool call and an answer per user turn
    for conversation, turns in runs.items():
        assert sorted(t for t, _, _ in turns) == list(range(1, requests + 1)), conversation
        assert {s for _, _, s in turns} == {200}
        assert len({b for _, b, _ in turns}) == 1, (conversation, turns)
    assert {turns[0][1] for turns in runs.values()} == {"hosted", "vllm"}
    assert report.identity.split == 0
    assert report.identity.conversations == RUNS
    # The by-turn table has a row for each of the runs' turns (not all of them at turn 1).
    assert [row.turn for row in report.cache_by_turn] == [str(t) for t in range(1, requests + 1)]
