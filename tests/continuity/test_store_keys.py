"""Pins and links keyed by the store's keyed hash, not by the conversation key in the clear
(a session id is often an email), and a store written before that upgraded in place.

The fixtures (the rollout store's, under tests/rollout/fixtures/) were made by
`make_round2_store.py` run with main's code at commit d2185f9 (keys in the clear): a SQLite
file, and the Redis keys as JSON. They hold a split at 10%, pins per cohort (a session, a
`user`), a pin made before cohorts, and links: a Responses chain started under a session id,
a Conversations API id and a history digest.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import redis
from test_responses_chains import (
    MODEL,
    ConfigFor,
    by_conversation,
    client_for,
    record_rows,
    start,
)

from kvmigrate.config import Config, parse_config
from kvmigrate.continuity.chains import ChainMap
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies.chain import ChainEntry, ChainRef
from kvmigrate.policies.split import in_candidate_share
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.keys import is_hashed
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.store import RolloutStore, open_store

FIXTURES = Path(__file__).parents[1] / "rollout" / "fixtures"  # the rollout store's
PERSONAL = ("alice", "bob", "carol", "example.com")
DIGEST_LINK = "c:" + "ab" * 16

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama-8b}}
rollout: {{state: "{url}", mode: split, percent: 0}}
"""


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def round2_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        shutil.copy(FIXTURES / "round2_state.db", tmp_path / "state.db")
        return f"sqlite:///{tmp_path}/state.db"
    url = str(request.getfixturevalue("fresh_redis_url"))
    client = redis.Redis.from_url(url, decode_responses=True)
    for key, value in json.loads((FIXTURES / "round2_redis.json").read_text()).items():
        if "string" in value:
            client.set(key, value["string"])
        elif "hash" in value:
            client.hset(key, mapping=value["hash"])
        else:
            client.rpush(key, *value["list"])
    client.close()
    return url


def config_for(url: str) -> Config:
    return parse_config(CONFIG.format(url=url), env={})


def stored_text(url: str) -> str:
    """Everything the store holds about pins and links, as text."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            rows = db.execute("SELECT * FROM rollout_pins").fetchall()
            rows += db.execute("SELECT * FROM rollout_links").fetchall()
        return repr(rows)
    client = redis.Redis.from_url(url, decode_responses=True)
    names = sorted(client.keys("kvmigrate:rollout:pin:*") + client.keys("kvmigrate:rollout:link:*"))
    text = repr([(name, client.get(name)) for name in names])
    client.close()
    return text


def test_the_upgrade_hashes_every_key_and_declared_conversation(round2_url: str) -> None:
    before = stored_text(round2_url)
    assert all(word in before for word in PERSONAL)  # the fixture holds them in the clear
    store = open_store(round2_url, initial_state(config_for(round2_url)))
    try:
        after = stored_text(round2_url)
        assert not any(word in after for word in PERSONAL), after
        assert len(store.load_pins()) == 3
        assert all(is_hashed(pin.conversation) for pin in store.load_pins())
        # A digest the proxy derived names nobody: kept, so continuity keeps its key.
        link = store.load_links([store.keys.key(DIGEST_LINK)])
        assert [(x.conversation, x.turn) for x in link] == [("h:" + "cd" * 12, 2)]
    finally:
        store.close()
    # Reopened (by this proxy or another): the same secret, nothing hashed twice.
    again = open_store(round2_url, initial_state(config_for(round2_url)))
    try:
        assert stored_text(round2_url) == after
        assert {p.conversation for p in again.load_pins()} == {
            again.keys.key(k)
            for k in (
                "gpt-4o-mini:alice@example.com",
                "gpt-4o-mini:user:bob@example.com",
                "carol@example.com",
            )
        }
    finally:
        again.close()


def test_pins_made_before_the_upgrade_still_hold(round2_url: str) -> None:
    config = config_for(round2_url)
    store = open_store(round2_url, initial_state(config))
    live = LiveRollout(config, store)
    served = config.models[0].served
    # Without their pins, the 10% split would send alice to the primary and bob to the
    # candidate (carol's pin, made before cohorts, agrees with the split).
    assert not in_candidate_share("kvmigrate", "alice@example.com", 10)
    assert in_candidate_share("kvmigrate", "user:bob@example.com", 10)

    async def routes() -> list[str]:
        await live.running()
        try:
            return [
                (await live.route(conversation, 2, served, "gpt-4o-mini")).serve
                for conversation in (
                    "alice@example.com",
                    "carol@example.com",
                    "user:bob@example.com",
                )
            ]
        finally:
            await live.done()

    try:
        assert asyncio.run(routes()) == ["vllm", "vllm", "hosted"]
    finally:
        store.close()


def test_a_chain_started_before_the_upgrade_continues_as_the_same_conversation(
    round2_url: str,
) -> None:
    store = open_store(round2_url, initial_state(config_for(round2_url)))
    chains = ChainMap(ContinuityResolver(store, 60.0))

    async def identify() -> list[tuple[str, int, str | None]]:
        found = [
            await chains.identify(ChainRef("resp_alice1", None), "alice@example.com"),
            await chains.identify(ChainRef(None, "conv_42")),
        ]
        return [(i.conversation, i.turn, backend) for i, backend in found]

    try:
        assert asyncio.run(identify()) == [
            ("alice@example.com", 2, "vllm"),  # the session id it declares again
            ("conv:conv_42", 4, "hosted"),  # the Conversations API id it names again
        ]
    finally:
        store.close()


def test_a_chain_whose_next_turn_declares_nothing_keeps_one_hashed_key(sqlite_url: str) -> None:
    """Other proxies continue a chain: the store names its conversation only hashed, and a
    request that does not declare it again gets that hash, the same at every later turn."""
    store = open_store(sqlite_url, initial_state(config_for(sqlite_url)))

    async def continued() -> list[str]:
        first = ChainMap(ContinuityResolver(store, 60.0))
        first.keep("r:resp_1", ChainEntry("dave@example.com", 1, "hosted"))
        await first.links.done()  # the links' last batch goes to the store
        second = ChainMap(ContinuityResolver(store, 60.0))
        identity, _ = await second.identify(ChainRef("resp_1", None))
        second.keep("r:resp_2", ChainEntry(identity.conversation, 2, "hosted"))
        await second.links.done()
        later, _ = await ChainMap(ContinuityResolver(store, 60.0)).identify(
            ChainRef("resp_2", None)
        )
        return [identity.conversation, later.conversation]

    try:
        conversations = asyncio.run(continued())
        assert conversations == [store.keys.key("dave@example.com")] * 2
        assert "dave" not in stored_text(sqlite_url)
    finally:
        store.close()


def test_every_store_on_one_url_shares_the_secret(round2_url: str) -> None:
    stores: list[RolloutStore] = [
        open_store(round2_url, initial_state(config_for(round2_url))) for _ in "ab"
    ]
    try:
        a, b = (s.keys.key("alice@example.com") for s in stores)
        assert a == b
        assert is_hashed(a)
    finally:
        for s in stores:
            s.close()


def chains_through_two_proxies(
    config: Config, sessions: list[str], declare_every_turn: bool
) -> None:
    """Three turns of a Responses chain per session, each turn on the other proxy of two
    sharing `config`'s store; the session's `X-Session-ID` at every turn, or at its first."""
    proxies = [start(config), start(config)]
    clients = [client_for(p) for p in proxies]
    for number, session in enumerate(sessions):
        previous = None
        for turn in range(1, 4):
            extra: dict[str, Any] = {}
            if declare_every_turn or previous is None:
                extra["extra_headers"] = {"X-Session-ID": session}
            if previous is not None:
                extra["previous_response_id"] = previous
            answer = clients[(number + turn) % 2].responses.create(
                model=MODEL, input=f"step {turn}", max_output_tokens=16, **extra
            )
            previous = answer.id
    for client in clients:
        client.close()
    for proxy in proxies:
        proxy.stop()  # flushes the recorder, the pins and the links


def test_sessions_through_two_proxies_stay_whole_and_the_store_names_nobody(
    config_for: ConfigFor, fresh_redis_url: str
) -> None:
    """Responses chains under an `X-Session-ID`, alternating between two proxies sharing
    Redis: every chain is one conversation (its session id, recovered from the hash), and
    neither a pin nor a link names a session."""
    config = config_for("mode: split, percent: 50", state=fresh_redis_url)
    sessions = [f"agent-{n}@example.com" for n in range(4)]
    chains_through_two_proxies(config, sessions, declare_every_turn=True)
    served = by_conversation(record_rows(config), "serve")
    assert {c: [r[1] for r in turns] for c, turns in served.items()} == {
        s: [1, 2, 3] for s in sessions
    }  # the records keep it (content: full): one conversation per session
    stored = stored_text(fresh_redis_url)
    assert "link:" in stored
    assert "pin:" in stored
    assert "example.com" not in stored, stored


def test_a_session_declared_only_at_its_first_turn_is_one_conversation_in_redacted_records(
    config_for: ConfigFor, fresh_redis_url: str
) -> None:
    """Responses chains whose first turn alone names its `X-Session-ID`, each turn on the
    other proxy: later turns are known by the store's hash of the session, so the records
    (redacted, the default) group every turn under one key, and name no session."""
    config = config_for("mode: split, percent: 50", state=fresh_redis_url, content="redacted")
    chains_through_two_proxies(
        config, [f"agent-{n}@example.com" for n in range(3)], declare_every_turn=False
    )
    rows = record_rows(config)
    served = by_conversation(rows, "serve")
    assert sorted([r[1] for r in turns] for turns in served.values()) == [[1, 2, 3]] * 3
    assert {r[6] for r in rows if r[1] == 1} == {"header"}
    assert {r[6] for r in rows if r[1] > 1} == {"chain"}
    assert not any("example.com" in r[0] for r in rows)


def test_a_shadow_copy_is_recorded_in_its_answers_conversation(
    config_for: ConfigFor, sqlite_url: str
) -> None:
    """Redacted records name a declared session by the store's hash of it. A shadow copy
    carries its answer's name, so the two are one conversation in reports, and the
    recorder, which pairs a copy with its answer within a lane chosen by that name, scores
    it."""
    config = config_for("mode: shadow", state=sqlite_url, content="redacted")
    proxy = start(config)
    client = client_for(proxy)
    sessions = [f"agent-{n}@example.com" for n in range(4)]
    for session in sessions:
        previous = None
        for turn in range(1, 3):
            extra: dict[str, Any] = {"extra_headers": {"X-Session-ID": session}}
            if previous is not None:
                extra["previous_response_id"] = previous
            previous = client.responses.create(
                model=MODEL, input=f"step {turn}", max_output_tokens=16, **extra
            ).id
    client.close()
    proxy.stop()  # flushes the recorder
    rows = record_rows(config)
    served, copies = by_conversation(rows, "serve"), by_conversation(rows, "shadow")
    assert len(served) == len(sessions)
    assert {c: [r[1] for r in turns] for c, turns in copies.items()} == {c: [1, 2] for c in served}
    assert not any("example.com" in r[0] for r in rows)
