"""Responses chains shadowed to several candidates: each candidate's shadow copy continues
its own chain, naming its own id of the turn before (issue 19). Real emulators (each 404s an
id it never issued), a real proxy, the official openai SDK, real SQLite and redis-server
stores; and the chain map still reads the links earlier releases wrote."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from candidate_backends import two_candidates

from kvmigrate.config import Config, parse_config
from kvmigrate.continuity.chains import ChainMap
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies.chain import RESPONSE_PREFIX
from kvmigrate.recorder.store import open_store as open_record_store
from kvmigrate.rollout.state import Link, RolloutState
from kvmigrate.rollout.store import open_store
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
CANDIDATES = ("vllm", "vllm-fp8")
CHAINS = 3
TURNS = 4
Copy = tuple[int, int, dict[str, Any], dict[str, Any]]  # turn, status, request, response


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, BackgroundServer]]:
    with two_candidates(time_scale=0.02) as servers:
        yield servers


def config_for(tmp_path: Path, emulators: dict[str, BackgroundServer], state: str) -> Config:
    urls = {name: server.url for name, server in emulators.items()}
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "{urls["hosted"]}/v1"}}
  vllm: {{api_base: "{urls["vllm"]}/v1"}}
  vllm-fp8: {{api_base: "{urls["vllm-fp8"]}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}, vllm-fp8: {SERVED},
      candidates: [vllm, vllm-fp8]}}
rollout: {{mode: shadow, noise_sample: 0, state: "{state}"}}
record: {{db: "sqlite:///{tmp_path}/records.db", content: full}}
""",
        env={},
    )


def shadow_turns(config: Config) -> dict[tuple[str, str], list[Copy]]:
    """(candidate, conversation) -> its copies by turn: (turn, status, request, response)."""
    store = open_record_store(config.record.db)
    try:
        rows = store.query(
            "SELECT backend, conversation, turn, status, request_json, response_json "
            "FROM records WHERE route = 'responses' AND role = 'shadow'",
            (),
        )
    finally:
        store.close()
    copies: dict[tuple[str, str], list[Copy]] = {}
    for backend, conversation, turn, status, request, response in rows:
        copies.setdefault((str(backend), str(conversation)), []).append(
            (int(turn), int(status or 0), orjson.loads(request), orjson.loads(response or "{}"))
        )
    return {key: sorted(turns, key=lambda t: t[0]) for key, turns in copies.items()}


@pytest.mark.parametrize("shared", [False, True], ids=["one-proxy-sqlite", "two-proxies-redis"])
def test_each_candidate_continues_its_own_chain(
    tmp_path: Path, emulators: dict[str, BackgroundServer], fresh_redis_url: str, shared: bool
) -> None:
    state = fresh_redis_url if shared else f"sqlite:///{tmp_path}/state.db"
    config = config_for(tmp_path, emulators, state)
    proxies = [
        BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()
        for _ in range(2 if shared else 1)
    ]
    clients = [
        openai.OpenAI(base_url=p.url + "/v1", api_key="sk-client", max_retries=0) for p in proxies
    ]
    for number in range(CHAINS):
        previous = None
        for turn in range(1, TURNS + 1):
            client = clients[turn % len(clients)]  # two proxies: alternate them
            answer = client.responses.create(
                model=MODEL,
                input=f"Chain {number}: and step {turn}?",
                max_output_tokens=32,
                previous_response_id=previous or openai.omit,
            )
            assert answer.output_text
            previous = answer.id
    for client in clients:
        client.close()
    for proxy in proxies:
        proxy.stop()

    copies = shadow_turns(config)
    assert {backend for backend, _ in copies} == set(CANDIDATES)
    assert len(copies) == CHAINS * len(CANDIDATES)
    for (backend, conversation), turns in copies.items():
        # The candidate 404s an id it never issued: every turn answered means each copy
        # named this candidate's own answer of the turn before, not the other one's.
        assert [(t, status) for t, status, _, _ in turns] == [
            (t, 200) for t in range(1, TURNS + 1)
        ], (backend, conversation)
        assert "previous_response_id" not in turns[0][2]
        for before, after in itertools.pairwise(turns):
            assert after[2]["previous_response_id"] == before[3]["id"], (backend, conversation)
    ids = {
        b: {t[3]["id"] for k, turns in copies.items() if k[0] == b for t in turns}
        for b in CANDIDATES
    }
    assert not ids["vllm"] & ids["vllm-fp8"]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_links_written_by_the_previous_release_still_read(
    tmp_path: Path, fresh_redis_url: str, kind: str
) -> None:
    """A chain link as the release before several candidates wrote it (`[backend, shadow]`)
    gives its shadow to the model's only candidate; a link with several candidates' ids
    keeps the two-item head an older reader of a one-candidate model needs."""
    url = fresh_redis_url if kind == "redis" else f"sqlite:///{tmp_path}/state.db"
    store = open_store(url, RolloutState())
    expires = time.time() + 600
    # As an upgraded store holds it: key and conversation under the store's keyed hash
    # (kvmigrate.rollout.keys; tests/continuity/test_store_keys.py upgrades one in the clear).
    keys = store.keys
    conversation = keys.conversation("conv-1")
    old_key = keys.key(RESPONSE_PREFIX + "resp_old")
    old = Link(old_key, conversation, 2, expires, '["hosted", "resp_vllm_2"]')
    store.save_links([old])

    async def read() -> tuple[str | None, str | None, str | None]:
        chains = ChainMap(ContinuityResolver(store))
        shadowed = await chains.shadow_id_of("resp_old")
        entry = await chains.find(RESPONSE_PREFIX + "resp_old")
        assert entry is not None
        assert (entry.conversation, entry.turn, entry.backend) == (conversation, 2, "hosted")
        several = entry.with_shadow_id("vllm-fp8", "resp_fp8_2")
        chains.keep(RESPONSE_PREFIX + "resp_new", several)
        await chains.links.done()  # the writer's last batch
        fresh = ChainMap(ContinuityResolver(store))
        again = await fresh.find(RESPONSE_PREFIX + "resp_new")
        assert again is not None
        return shadowed, again.shadow_id_for("vllm-fp8"), again.shadow_id_for("vllm")

    try:
        shadowed, fp8, vllm = asyncio.run(read())
        assert shadowed == "resp_vllm_2"
        assert (fp8, vllm) == ("resp_fp8_2", "")
        (new,) = store.load_links([keys.key(RESPONSE_PREFIX + "resp_new")])
        backend, shadow, named = orjson.loads(new.detail)
        assert (backend, shadow, named) == ("hosted", "resp_vllm_2", {"vllm-fp8": "resp_fp8_2"})
    finally:
        store.close()
