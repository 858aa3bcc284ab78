"""A shared store that does not answer must not cost a conversation its pin: the turn goes by
the split, this replica holds that choice briefly and here only, then follows the store's pin
(another replica's) again.

The store is a real redis-server, paused with SIGSTOP (a hung store: reads time out, nothing
is refused)."""

from __future__ import annotations

import asyncio
import signal
import time

from stores import RedisServer

from kvmigrate.config import parse_config
from kvmigrate.policies.split import in_candidate_share
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.rollout.state import Pin
from kvmigrate.rollout.store import open_store

MODEL = "gpt-4o-mini"
CONVERSATION = "session:agent-7"
HOLD_S = 1.0  # the test's UNANSWERED_PIN_S; only a lower bound on a wait depends on it
CONFIG = """
backends:
  hosted: {{api_base: "http://127.0.0.1:9/v1"}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: llama-8b}}
rollout: {{state: "{url}", mode: split, percent: 100}}
"""


def test_a_store_that_does_not_answer_leaves_the_conversation_to_its_pin_once_it_answers(
    fresh_redis_url: str, paused: RedisServer
) -> None:
    config = parse_config(CONFIG.format(url=fresh_redis_url), env={})
    served = config.models[0].served
    # At 100% the split sends every conversation to the candidate; another replica pinned
    # this one on the primary (at an earlier percent), and a pin to the primary holds.
    assert in_candidate_share("kvmigrate", CONVERSATION, 100)
    store = open_store(fresh_redis_url, initial_state(config))
    live = LiveRollout(config, store, unanswered_pin_s=HOLD_S)

    async def turns() -> list[str]:
        await live.running()
        key = live.keys.key(f"{MODEL}:{CONVERSATION}")
        store.save_pins([Pin(key, "hosted", 0, time.time() + 600)])
        paused.process.send_signal(signal.SIGSTOP)
        try:
            # The store does not answer (a read times out): the split decides, and the
            # next turn follows that choice without waiting for the store again.
            routes = [
                (await live.route(CONVERSATION, turn, served, MODEL)).serve for turn in (2, 3)
            ]
        finally:
            paused.process.send_signal(signal.SIGCONT)
        await asyncio.sleep(HOLD_S * 1.5)
        # Once the hold is over, the store answers, with the other replica's pin.
        routes.append((await live.route(CONVERSATION, 4, served, MODEL)).serve)
        await live.done()  # saves the pins it made: none over the other replica's
        return [*routes, key]

    try:
        *routes, key = asyncio.run(turns())
        assert routes == ["vllm", "vllm", "hosted"]
        assert [(p.conversation, p.backend) for p in store.load_pins([key])] == [(key, "hosted")]
    finally:
        store.close()
