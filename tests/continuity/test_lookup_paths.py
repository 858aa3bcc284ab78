"""The same behaviour through every path a lookup may take: the Responses chain map (which
backend stored a response id) and the continuity links (which conversation a turn belongs
to), with no rollout store (this process's memory), the workers' shared table, SQLite and
Redis.

Before, each path was tested through its own store's API, and a proxy whose store-less path
lost its lookups (or whose store path did) passed. Here a real SDK client drives a split at
50% through real proxies; on every path but the in-process one, each turn reaches a proxy
started after the previous turn's proxy stopped, so nothing survives in memory but what the
path itself keeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web

from kvmigrate.config import Config, parse_config
from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
TURNS = 3
# Conversations are started until each backend holds EACH (at 50% each lands on the
# candidate by a coin of its own, drawn from the store's secret where there is one); a
# lost lookup moves one with chance 1/2, so six in all leave it unseen with 2 ** -6 a turn.
EACH = 3
MOST = 60


def _until_both_sides(start: Callable[[int], str]) -> list[str]:
    """The backends of conversations started by `start(i)`, until EACH are on each side."""
    served: list[str] = []
    while min(served.count("hosted"), served.count("vllm")) < EACH and len(served) < MOST:
        served.append(start(len(served)))
    assert min(served.count("hosted"), served.count("vllm")) == EACH  # the split works
    return served


@dataclass(frozen=True)
class Path_:
    """How a proxy is built on this path, and whether each turn gets a fresh proxy."""

    name: str
    build: Callable[[Config, Path], web.Application]
    restarts: bool  # a fresh proxy for each turn: the lookup must outlive the process
    chains: bool  # whether Responses chains outlive a proxy on this path


def _memory(config: Config, _: Path) -> web.Application:
    return build_proxy_app(config)  # no store: ContinuityResolver() and ChainMap in memory


def _table(config: Config, root: Path) -> web.Application:
    # A worker of `proxy --workers N`: the links in the table the pool's parent made.
    table = root / "conversation-links.table"
    if not table.exists():
        create_table(str(root), buckets=64, shadow_id_buckets=16)
    identity = ContinuityResolver(
        ttl_seconds=config.rollout.pin_ttl_seconds, table=LinkTable(table)
    )
    return build_proxy_app(config, identity=identity)


def _store(config: Config, _: Path) -> web.Application:
    return build_runtime_app(config, record=False)  # `kvmigrate proxy`: the rollout store's links


PATHS = (
    Path_("memory", _memory, restarts=False, chains=True),
    Path_("table", _table, restarts=True, chains=False),
    Path_("sqlite", _store, restarts=True, chains=True),
    Path_("redis", _store, restarts=True, chains=True),
)


def as_params(paths: Iterable[Path_]) -> list[Any]:
    """The paths as parameters named after them, the Redis one marked `redis`."""
    marks = {"redis": [pytest.mark.redis]}
    return [pytest.param(p, id=p.name, marks=marks.get(p.name, [])) for p in paths]


@pytest.fixture(scope="module")
def emulators() -> Iterator[tuple[BackgroundServer, BackgroundServer]]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0)))
    with hosted, vllm:
        yield hosted, vllm


@pytest.fixture
def proxies(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    emulators: tuple[BackgroundServer, BackgroundServer],
) -> Iterator[Callable[[], openai.OpenAI]]:
    """A client of the path's proxy: each call, on a restarting path, stops the proxy the
    previous one reached and starts another."""
    path: Path_ = request.param
    if path.name == "redis":
        state = request.getfixturevalue("fresh_redis_url")
    else:
        state = f"sqlite:///{tmp_path}/state.db"
    hosted, vllm = emulators
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{vllm.url}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}}}
rollout: {{mode: split, percent: 50, shadow_sample: 0, noise_sample: 0, fallback: false,
           state: "{state}"}}
record: {{enabled: false}}
cachecheck: {{enabled: false}}
""",
        env={},
    )
    with contextlib.ExitStack() as running:
        current: list[tuple[BackgroundServer, openai.OpenAI]] = []

        def client() -> openai.OpenAI:
            if current and not path.restarts:
                return current[-1][1]
            if current:
                old_proxy, old_client = current.pop()
                old_client.close()
                old_proxy.stop()  # its links written where the path keeps them
            proxy = BackgroundServer(lambda: path.build(config, tmp_path)).start()
            sdk = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
            current.append((proxy, sdk))
            return sdk

        running.callback(lambda: [(c.close(), p.stop()) for p, c in current])
        yield client


def _served(raw: Any) -> str:
    return str(raw.headers["x-kvmigrate-backend"])


def _chain_turn(client: openai.OpenAI, text: str, previous: str | None) -> tuple[str, str]:
    """(the backend that answered, the answer's id)."""
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=text, **({"previous_response_id": previous} if previous else {})
    )
    return _served(raw), raw.parse().id


@pytest.mark.parametrize("proxies", as_params(p for p in PATHS if p.chains), indirect=True)
def test_a_responses_chain_stays_on_the_backend_that_stored_its_first_turn(
    proxies: Callable[[], openai.OpenAI],
) -> None:
    """Turns 2 and 3 name the previous answer's id; the backend that stored it answers
    (a lost lookup sends them to the primary, which never stored a candidate's id)."""
    client = proxies()
    ids: list[str] = []

    def start(i: int) -> str:
        backend, answer = _chain_turn(client, f"Chain {i}: tell me about topic {i}.", None)
        ids.append(answer)
        return backend

    chains = list(zip(_until_both_sides(start), ids, strict=True))
    for turn in range(2, TURNS + 1):
        client = proxies()  # on a restarting path, a fresh proxy for the turn
        for i, (backend, previous) in enumerate(chains):
            served, answer = _chain_turn(client, f"Turn {turn}: go on.", previous)
            assert served == backend, (i, turn)
            chains[i] = (backend, answer)


def _conversation_turn(
    client: openai.OpenAI, history: list[dict[str, str]], turn: int, i: int
) -> str:
    """One turn whose system prompt changes every turn (a date, a counter): only the
    continuity link, from the previous answer, says which conversation it is."""
    history.append({"role": "user", "content": f"Conversation {i}, question {turn}."})
    system = {"role": "system", "content": f"You are helpful. Turn {turn}; now is 10:0{turn}."}
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[system, *history],  # type: ignore[list-item]
    )
    history.append({"role": "assistant", "content": raw.parse().choices[0].message.content or ""})
    return _served(raw)


@pytest.mark.parametrize("proxies", as_params(PATHS), indirect=True)
def test_a_conversation_whose_system_prompt_changes_stays_on_one_backend(
    proxies: Callable[[], openai.OpenAI],
) -> None:
    client = proxies()
    histories: list[list[dict[str, str]]] = []

    def start(i: int) -> str:
        histories.append([])
        return _conversation_turn(client, histories[-1], 1, i)

    first = _until_both_sides(start)
    for turn in range(2, TURNS + 1):
        client = proxies()
        served = [_conversation_turn(client, h, turn, i) for i, h in enumerate(histories)]
        assert served == first, turn
