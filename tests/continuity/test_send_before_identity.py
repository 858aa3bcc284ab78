"""In shadow mode the primary answers every conversation alike, so the proxy sends the call
before it identifies the conversation: identity (a digest of the whole history, and for a
history this proxy has not seen, a lookup in the shared store) runs while the primary works.

The store is a real redis-server, paused with SIGSTOP (a hung store): the lookup of a
resumed conversation waits for it, and the primary must have the request meanwhile."""

from __future__ import annotations

import asyncio
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import orjson
from aiohttp import web
from stores import RedisServer

from kvmigrate.config import Config, parse_config
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.embedded import HOSTED_MODEL as MODEL
from kvmigrate.embedded import VLLM_MODEL as SERVED
from kvmigrate.proxy import build_proxy_app
from kvmigrate.rollout.controller import initial_state
from kvmigrate.rollout.store import open_store
from kvmigrate.serving import BackgroundServer

LOOKUP_S = 30.0  # how long the proxy waits for the hung store: far past the test's waits
ANSWER = {
    "id": "chatcmpl-held",
    "object": "chat.completion",
    "created": 1,
    "model": SERVED,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "done"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}


class HeldUpstream:
    """Answers each call once the test releases it, says when a call has arrived, and notes
    how many requests the proxy had identified by then."""

    def __init__(self, identity: ContinuityResolver) -> None:
        self.identity = identity
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.bodies: list[dict[str, Any]] = []
        self.identified_on_arrival: list[int] = []

    def app(self) -> web.Application:
        async def complete(request: web.Request) -> web.Response:
            self.identified_on_arrival.append(sum(self.identity.counts.values()))
            self.bodies.append(orjson.loads(await request.read()))
            self.arrived.set()
            await asyncio.to_thread(self.release.wait, LOOKUP_S)
            return web.json_response(ANSWER)

        app = web.Application()
        app.router.add_post("/v1/chat/completions", complete)
        return app


def _config(upstream: str, state: str, rollout: str) -> Config:
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "{upstream}/v1"}}
  vllm: {{api_base: "{upstream}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}}}
rollout: {{state: "{state}", {rollout}}}
""",
        env={},
    )


def test_in_shadow_mode_the_primary_has_the_request_while_identity_waits_for_the_store(
    fresh_redis_url: str, paused: RedisServer
) -> None:
    config = _config("http://127.0.0.1:9", fresh_redis_url, "mode: shadow, shadow_sample: 0")
    store = open_store(fresh_redis_url, initial_state(config))
    identity = ContinuityResolver(store, 3600.0, remote_timeout=LOOKUP_S)
    held = HeldUpstream(identity)
    with BackgroundServer(held.app) as upstream:
        config = _config(upstream.url, fresh_redis_url, "mode: shadow, shadow_sample: 0")
        with (
            BackgroundServer(lambda: build_proxy_app(config, identity=identity)) as proxy,
            ThreadPoolExecutor(1) as pool,
        ):
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
            held.release.set()  # the first call opens the connection the next one reuses
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "warm up"}]
            )
            held.release.clear()
            held.arrived.clear()
            paused.process.send_signal(signal.SIGSTOP)
            # A conversation resumed from before a restart: its history is not known here,
            # so identity asks the store, which does not answer.
            resumed = [
                {"role": "user", "content": "plan the trip"},
                {"role": "assistant", "content": "Day one: Lisbon."},
                {"role": "user", "content": "and day two?"},
            ]
            answer = pool.submit(
                client.chat.completions.create, model=MODEL, messages=resumed, timeout=120
            )
            try:
                assert held.arrived.wait(LOOKUP_S), "the call never reached the primary"
                assert not answer.done()
            finally:
                paused.process.send_signal(signal.SIGCONT)
                held.release.set()
            completion = answer.result(timeout=60)
            client.close()
    assert completion.choices[0].message.content == "done"
    # The warm-up found no idle connection: identified, then sent (the usual path). The
    # resumed turn reached the primary before its own identity was settled (the store's
    # read gives up after its socket timeout, 2 s): only the warm-up's was, then.
    assert held.identified_on_arrival == [1, 1]
    assert sum(identity.counts.values()) == 2
    # The call sent early is the usual one: the primary's own model name, the whole history.
    assert held.bodies[-1]["model"] == MODEL
    assert held.bodies[-1]["messages"] == resumed
    store.close()
