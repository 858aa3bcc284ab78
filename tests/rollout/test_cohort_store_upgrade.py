"""A rollout store written by round-1 code (one global state) opened by the cohort-aware
code: nothing moves, no history is lost, and cohorts then change one at a time.

The fixtures were made by `fixtures/make_round1_store.py` run with main's code at commit
dc1da75 (before cohorts): a SQLite file, and the Redis keys as JSON. Both hold four changes
(10%, 50%, an auto-rollback to 0%, 25%) and two pins.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from kvmigrate.config import Config, parse_config
from kvmigrate.policies import Mode
from kvmigrate.policies.split import in_candidate_share
from kvmigrate.rollout.controller import RolloutController, RolloutError, initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.store import open_store

FIXTURES = Path(__file__).parent / "fixtures"
ROUND1_ACTIONS = ["promote", "promote", "auto-rollback", "promote"]

CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama-8b}}
  - {{model_name: gpt-4o, hosted: gpt-4o, vllm: llama-70b}}
cohorts:
  - {{name: billing-bot, model: gpt-4o-mini, match: {{header: {{X-Agent: billing-bot}}}}}}
rollout: {{state: "{url}", mode: shadow, percent: 0}}
"""


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def round1_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        shutil.copy(FIXTURES / "round1_state.db", tmp_path / "state.db")
        return f"sqlite:///{tmp_path}/state.db"
    url = str(request.getfixturevalue("fresh_redis_url"))
    client = redis.Redis.from_url(url, decode_responses=True)
    for key, value in json.loads((FIXTURES / "round1_redis.json").read_text()).items():
        if "string" in value:
            client.set(key, value["string"])
        else:
            client.rpush(key, *value["list"])
    client.close()
    return url


@pytest.fixture
def controller(round1_url: str) -> Iterator[RolloutController]:
    config: Config = parse_config(CONFIG.format(url=round1_url), env={})
    ctl = RolloutController(config, open_store(round1_url, initial_state(config)), None)
    yield ctl
    ctl.store.close()


def test_every_cohort_starts_where_the_round1_rollout_stood(
    controller: RolloutController,
) -> None:
    for cohort in ("billing-bot", "gpt-4o-mini", "gpt-4o"):
        state = controller.read(cohort)
        assert (state.mode, state.percent, state.epoch, state.version) == (Mode.SPLIT, 25, 1, 4)
    assert [e.action for e in controller.history()] == ROUND1_ACTIONS
    assert [e.action for e in controller.history(cohort="gpt-4o")] == ROUND1_ACTIONS
    # Keyed by the store's keyed hash since (test_store_keys_upgrade.py).
    keys = controller.store.keys
    assert {p.conversation: p.backend for p in controller.store.load_pins()} == {
        keys.key("conv-1"): "vllm",
        keys.key("conv-2"): "hosted",
    }


def test_a_cohort_moves_alone_and_the_history_keeps_the_round1_changes(
    controller: RolloutController,
) -> None:
    before = controller.store.version()
    outcome = controller.set_percent(100, "mini first", "tester", force=True, cohort="gpt-4o-mini")
    assert outcome.event.cohort == "gpt-4o-mini"
    assert (outcome.state.percent, outcome.state.version) == (100, 5)
    assert controller.store.version() > before  # what running proxies poll moved
    assert controller.read("gpt-4o").percent == 25
    assert controller.read("billing-bot").percent == 25

    rolled = controller.rollback("bad", "tester", cohort="billing-bot")
    assert rolled.state.epoch == 2  # only its pins to the candidate stop holding
    assert controller.read("gpt-4o-mini").epoch == 1
    assert controller.read("gpt-4o").epoch == 1

    everything = controller.history()
    assert [e.action for e in everything] == [*ROUND1_ACTIONS, "promote", "rollback"]
    assert [e.cohort for e in everything[-2:]] == ["gpt-4o-mini", "billing-bot"]
    mini = controller.history(cohort="gpt-4o-mini")
    assert [e.action for e in mini] == [*ROUND1_ACTIONS, "promote"]
    assert [e.action for e in controller.history(2)] == ["promote", "rollback"]
    states = controller.store.read_all()
    assert set(states.own) == {"gpt-4o-mini", "billing-bot"}
    assert states.default.percent == 25  # the fleet-wide default is never rewritten


def test_without_a_selector_a_multi_cohort_config_refuses_and_lists_the_cohorts(
    controller: RolloutController,
) -> None:
    with pytest.raises(RolloutError, match="billing-bot, gpt-4o-mini, gpt-4o"):
        controller.set_percent(50, force=True)
    with pytest.raises(RolloutError, match="no cohort 'nope'"):
        controller.set_percent(50, force=True, cohort="nope")
    assert controller.store.version() == 4  # nothing written
    statuses = controller.statuses()
    assert [s.cohort for s in statuses] == ["billing-bot", "gpt-4o-mini", "gpt-4o"]
    assert {s.next_step for s in statuses} == {50.0}


def test_round1_pins_still_hold_and_new_pins_are_the_cohorts(round1_url: str) -> None:
    config: Config = parse_config(CONFIG.format(url=round1_url), env={})
    store = open_store(round1_url, initial_state(config))
    live = LiveRollout(config, store)
    served = config.models[0].served

    async def routes() -> list[str]:
        await live.running()
        try:
            return [
                (await live.route(conversation, 2, served, cohort)).serve
                for conversation, cohort in (
                    ("conv-1", "gpt-4o-mini"),  # pinned to the candidate in epoch 1
                    ("conv-2", "gpt-4o-mini"),  # pinned to the primary
                    ("conv-1", "gpt-4o"),  # the same pin for every cohort that follows it
                )
            ]
        finally:
            await live.done()

    try:
        assert asyncio.run(routes()) == ["vllm", "hosted", "vllm"]
        # A conversation first seen now is pinned under its cohort, not globally.
        fresh = next(
            c for c in (f"new-{i}" for i in range(1000)) if in_candidate_share("kvmigrate", c, 25)
        )

        async def pin_fresh() -> None:
            await live.running()
            try:
                await live.route(fresh, 1, served, "gpt-4o")
            finally:
                await live.done()

        asyncio.run(pin_fresh())
        keys = {p.conversation for p in store.load_pins()}
        assert store.keys.key(f"gpt-4o:{fresh}") in keys
        assert store.keys.key(fresh) not in keys
    finally:
        store.close()
