"""The online detector: behind a real proxy, on the response path's budget, memory-bounded."""

from __future__ import annotations

import os
import signal
import statistics
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import orjson
import pytest

from kvmigrate.cachecheck.addon import CacheBusterAddon, CacheCheckResult
from kvmigrate.cachecheck.fingerprint import Fingerprint, FingerprintStore
from kvmigrate.cachecheck.render import render_chat
from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
SYSTEM = "You are a careful coding agent. Read the repository, explain your plan, then act."


@pytest.fixture(scope="module")
def emulators() -> Iterator[tuple[str, str]]:
    hosted = BackgroundServer(lambda: build_app(EmulatorSettings(profile="hosted", time_scale=0)))
    vllm = BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0)))
    with hosted, vllm:
        yield hosted.url, vllm.url


@pytest.fixture(params=["process", "thread"])
def proxy(
    emulators: tuple[str, str], request: pytest.FixtureRequest
) -> Iterator[tuple[str, CacheBusterAddon]]:
    hosted, vllm = emulators
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "{hosted}/v1"}}
  vllm: {{api_base: "{vllm}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout: {{mode: shadow}}
""",
        env={},
    )
    addon = CacheBusterAddon(worker=request.param)
    with BackgroundServer(lambda: build_proxy_app(config, addons=[addon])) as server:
        yield server.url, addon


def _metric(url: str, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
    return total


def _talk(
    client: openai.OpenAI, system: str | None, turns: int, stream: bool, **kw: object
) -> None:
    messages: list[dict[str, str]] = []
    for turn in range(turns):
        now = f"2025-01-06T10:{10 + turn:02d}:{(17 * turn) % 60:02d}Z"
        top = [{"role": "system", "content": system.format(now=now)}] if system else []
        messages.append({"role": "user", "content": f"Step {turn}: look at the next file."})
        if stream:
            chunks = client.chat.completions.create(
                model=MODEL, messages=[*top, *messages], max_tokens=16, stream=True, **kw
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(
                model=MODEL, messages=[*top, *messages], max_tokens=16, **kw
            )
            text = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": text})


@pytest.mark.parametrize("stream", [False, True])
def test_timestamp_in_system_prompt_is_counted_in_metrics(
    proxy: tuple[str, CacheBusterAddon], stream: bool
) -> None:
    url, addon = proxy
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    # No session header: the proxy keys this conversation by a hash of its system prompt,
    # which changes every turn; the addon must still see one conversation.
    _talk(client, "Current time: {now}\n" + SYSTEM, 4, stream)
    _talk(client, SYSTEM, 4, stream, extra_headers={"X-Session-ID": f"clean-{stream}"})
    # The last answer reaches the addon just after the client has read it: wait for it.
    deadline = time.monotonic() + 10
    while _metric(url, "kvmigrate_prefix_reuse_ratio_count") < 6 < deadline - time.monotonic():
        time.sleep(0.02)
    assert addon.wait_idle()
    assert _metric(url, "kvmigrate_cache_breaks_total", **{"class": "timestamp"}) == 3
    assert _metric(url, "kvmigrate_cache_breaks_total") == 3
    assert _metric(url, "kvmigrate_prefix_reuse_ratio_count") == 6
    assert _metric(url, "kvmigrate_prefix_reuse_ratio_bucket", le="0.99") == 3
    assert _metric(url, "kvmigrate_cachecheck_dropped_total") == 0
    assert _metric(url, "kvmigrate_cache_tokens_lost_total") > 0
    breaks = [r.check.brk for r in addon.results if r.check.brk is not None]
    assert [(b.cls.value, b.location.message, b.label) for b in breaks] == [
        ("timestamp", 0, "Current time:")
    ] * 3
    clean = [r.check for r in addon.results if r.conversation == f"clean-{stream}"]
    assert [c.ratio for c in clean] == [1.0] * 4
    assert clean[1].expected_tokens > 0


@dataclass
class _FakeExchange:
    request_id: str = "r"
    route: str = "chat/completions"
    role: str = "serve"
    conversation: str = "c"
    turn: int = 1
    request_body: bytes = b'{"messages": []}'
    chunks: list[bytes] = field(default_factory=list)
    ok: bool = True
    identity: str = ""


def test_exchange_done_costs_about_a_microsecond_and_counts_drops() -> None:
    n = 20_000
    addon = CacheBusterAddon(queue_size=n)  # worker not started: measure the enqueue alone
    exchange = _FakeExchange()
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n // 5):
            addon.exchange_done(exchange)
        timings.append((time.perf_counter() - start) / (n // 5) * 1e6)
    per_call = statistics.median(timings)
    print(f"exchange_done: {per_call:.2f} µs per call (median of 5 x {n // 5})")
    assert per_call < 20
    addon.exchange_done(exchange)  # the queue is full now
    addon.exchange_done(_FakeExchange(role="shadow"))  # ignored, not dropped
    assert addon.dropped._value.get() == 1


def test_store_is_bounded_by_count_bytes_and_age() -> None:
    rendering = render_chat([{"role": "user", "content": "hello " * 50}])
    entry = lambda now: Fingerprint.of(rendering, [1] * len(rendering.segments), now)  # noqa: E731
    store = FingerprintStore(max_entries=3, max_bytes=10**9, ttl_s=100)
    for i in range(5):
        store.put(f"k{i}", entry(float(i)))
    assert len(store) == 3
    assert store.get("k0", 5.0) is None
    assert store.get("k4", 5.0) is not None
    assert store.get("k2", 200.0) is None  # expired
    size = entry(0.0).size
    small = FingerprintStore(max_entries=100, max_bytes=2 * size, ttl_s=100)
    for i in range(5):
        small.put(f"k{i}", entry(float(i)))
    assert len(small) == 2
    assert small.bytes <= 2 * size
    assert small.get("k4", 5.0) is not None
    assert small.get("k4", 5.0).rendering().text == rendering.text


def _turns(conversation: str, turns: int, stamp: bool) -> list[_FakeExchange]:
    """An agent's turns as served exchanges; with `stamp`, a clock in the system prompt."""
    out, history = [], []
    for turn in range(turns):
        system = f"Now: 2025-01-06T10:{turn:02d}:00Z. {SYSTEM}" if stamp else SYSTEM
        history.append({"role": "user", "content": f"step {turn}: next file"})
        request = {"model": MODEL, "messages": [{"role": "system", "content": system}, *history]}
        answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        out.append(
            _FakeExchange(
                request_id=f"{conversation}-{turn}",
                conversation=conversation,
                turn=turn + 1,
                request_body=orjson.dumps(request),
                chunks=[orjson.dumps(answer)],
            )
        )
        history.append({"role": "assistant", "content": "ok"})
    return out


def test_a_killed_worker_is_restarted_and_what_it_lost_counted() -> None:
    addon = CacheBusterAddon(worker="process")
    addon.start()
    try:
        for x in _turns("a", 3, stamp=True):
            addon.exchange_done(x)
        assert addon.wait_idle()
        assert [r.check.brk is not None for r in addon.results] == [False, True, True]
        assert addon._process is not None
        assert addon._process._process is not None
        os.kill(addon._process._process.pid, signal.SIGKILL)
        addon._process._process.join(5)
        time.sleep(1.1)  # restarts are at most once a second
        for x in _turns("b", 3, stamp=True):
            addon.exchange_done(x)
        assert addon.wait_idle(timeout=30)
        # The new worker tracks conversations from scratch; its verdicts are the same.
        assert [r.check.brk is not None for r in list(addon.results)[3:]] == [False, True, True]
        assert addon._process.restarts == 1
    finally:
        addon.close()


@pytest.mark.parametrize("worker", ["process", "thread"])
def test_a_request_that_breaks_the_checker_is_counted_and_the_rest_checked(worker: str) -> None:
    seen: list[str] = []

    def on_result(result: CacheCheckResult) -> None:
        seen.append(result.request_id)
        if result.request_id == "ok2-0":
            raise RuntimeError("a consumer that fails")

    addon = CacheBusterAddon(worker=worker, on_result=on_result)
    addon.start()
    try:
        broken = _FakeExchange(request_id="broken", request_body=b'{"messages": [')
        for x in [*_turns("ok", 1, stamp=False), broken, *_turns("ok2", 2, stamp=False)]:
            addon.exchange_done(x)
        assert addon.wait_idle(timeout=30)
        assert addon.failed == 2  # the unparseable body, and the failing consumer
        assert seen == ["ok-0", "ok2-0", "ok2-1"]  # the feeder went on after both
        assert addon.processed == 3
    finally:
        addon.close()


def test_two_agents_that_open_with_the_same_user_message_are_two_conversations(
    proxy: tuple[str, CacheBusterAddon],
) -> None:
    """Agents of one fleet often differ in their system prompt alone; interleaved, each
    stays append-only and no turn of one is checked against the other's."""
    url, addon = proxy
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    agents = {
        name: [{"role": "system", "content": f"You are the {name} agent. " + SYSTEM}]
        for name in ("billing", "support")
    }
    for turn in range(3):
        for messages in agents.values():
            messages.append({"role": "user", "content": "Begin." if turn == 0 else "Go on."})
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    deadline = time.monotonic() + 10
    while _metric(url, "kvmigrate_prefix_reuse_ratio_count") < 4 < deadline - time.monotonic():
        time.sleep(0.02)
    assert addon.wait_idle()
    assert _metric(url, "kvmigrate_prefix_reuse_ratio_count") == 4  # turns 2 and 3 of each
    assert [r.check.brk for r in addon.results] == [None] * 6
    assert _metric(url, "kvmigrate_cache_breaks_total") == 0
