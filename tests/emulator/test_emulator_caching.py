"""Prefix caching: vLLM's block cache with its metrics, and OpenAI's 1024/128 rule."""

from __future__ import annotations

import re

from emulator_support import StartEmulator, client, model_of, raw
from openai.types import CompletionUsage

from kvmigrate.emulator.prefix_cache import PrefixCache
from kvmigrate.emulator.tokens import count_tokens, render_chat

SYSTEM = "You are a meticulous assistant for a travel agency. " * 40


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_vllm_turn_two_hits_cache_and_moves_metrics(start_emulator: StartEmulator) -> None:
    server = start_emulator("vllm")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Plan Rome"}]
    with client(server) as sdk:
        first = sdk.chat.completions.create(model=model_of(server), messages=messages)  # type: ignore[arg-type]
        before = raw(server, "GET", "/metrics")[2].decode()
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And Florence?"},
        ]
        second = sdk.chat.completions.create(model=model_of(server), messages=messages)  # type: ignore[arg-type]
    after = raw(server, "GET", "/metrics")[2].decode()
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached is not None
    assert cached % 16 == 0
    assert first.usage.prompt_tokens - 16 < cached <= first.usage.prompt_tokens + 40
    assert cached < second.usage.prompt_tokens
    label = "vllm:prefix_cache_hits_total"
    assert _metric(after, label) - _metric(before, label) == cached
    queries = "vllm:prefix_cache_queries_total"
    assert _metric(after, queries) - _metric(before, queries) == second.usage.prompt_tokens
    assert _metric(after, "vllm:prompt_tokens_cached_total") == cached
    assert _metric(after, "vllm:prompt_tokens_total") == (
        first.usage.prompt_tokens + second.usage.prompt_tokens
    )
    assert _metric(after, "vllm:generation_tokens_total") == (
        first.usage.completion_tokens + second.usage.completion_tokens
    )
    assert _metric(after, "vllm:time_to_first_token_seconds_count") == 2
    assert _metric(after, "vllm:e2e_request_latency_seconds_count") == 2
    assert _metric(after, "vllm:num_requests_running") == 0
    assert _metric(after, "vllm:num_requests_waiting") == 0
    assert 'model_name="meta-llama/Llama-3.1-8B-Instruct"' in after


def test_vllm_prompt_tokens_details_can_be_null(start_emulator: StartEmulator) -> None:
    server = start_emulator("vllm", prompt_tokens_details=False)
    with client(server) as sdk:
        reply = sdk.chat.completions.create(
            model=model_of(server), messages=[{"role": "user", "content": "hi"}]
        )
    assert reply.usage is not None
    assert reply.usage.prompt_tokens_details is None


def _hosted_prompt(tokens: int, salt: str) -> list[dict[str, str]]:
    text = f"{salt} " + "lorem ipsum dolor sit amet " * (tokens // 2)
    messages = [{"role": "user", "content": text}]
    while len(render_chat(messages)) > tokens:
        text = text[:-6]
        messages = [{"role": "user", "content": text}]
    return messages


def test_hosted_prompt_caching_rule(start_emulator: StartEmulator) -> None:
    server = start_emulator("hosted")
    long_prompt = _hosted_prompt(1100, "alpha")
    short_prompt = _hosted_prompt(900, "beta")
    assert 1024 < len(render_chat(long_prompt)) <= 1100
    with client(server) as sdk:

        def cached(messages: list[dict[str, str]]) -> int:
            reply = sdk.chat.completions.create(model=model_of(server), messages=messages)  # type: ignore[arg-type]
            assert reply.usage is not None
            assert reply.usage.prompt_tokens_details is not None
            return reply.usage.prompt_tokens_details.cached_tokens or 0

        assert cached(long_prompt) == 0
        assert cached(long_prompt) == 1024
        assert cached(short_prompt) == 0
        assert cached(short_prompt) == 0
        extended = [{"role": "user", "content": long_prompt[0]["content"] + " more " * 300}]
        assert cached(extended) == 1024
        assert cached(extended) == 1024 + 128 * ((len(render_chat(extended)) - 1024) // 128)


def test_block_cache_counts_whole_blocks_and_evicts() -> None:
    cache = PrefixCache.vllm(block_size=4, capacity_tokens=12)
    prompt = [f"t{i}" for i in range(10)]
    assert cache.lookup_and_insert(prompt).cached_tokens == 0
    assert cache.lookup_and_insert(prompt).cached_tokens == 8  # 2 whole blocks of 4
    assert cache.lookup_and_insert(prompt[:8]).cached_tokens == 4  # a full hit recomputes a block
    diverged = prompt[:5] + ["x"] * 5
    assert cache.lookup_and_insert(diverged).cached_tokens == 4
    assert cache.lookup_and_insert(prompt, salt="other-model").cached_tokens == 0
    assert cache.cached_token_count <= 12
    assert cache.lookup_and_insert(diverged).cached_tokens == 0  # evicted (LRU)


def test_hosted_cache_expires() -> None:
    now = [0.0]
    cache = PrefixCache(1024, 128, 10**6, recompute_last=False, ttl_s=60, clock=lambda: now[0])
    prompt = [str(i) for i in range(1300)]
    cache.lookup_and_insert(prompt)
    now[0] = 30
    assert cache.lookup_and_insert(prompt).cached_tokens == 1280
    now[0] = 200
    assert cache.lookup_and_insert(prompt).cached_tokens == 0


def test_tokenizer_is_about_four_chars_per_token() -> None:
    text = (
        "Prefix caching pays off only when every turn of a conversation reaches the same "
        "warm engine, and splitting requests destroys that."
    )
    assert 3.0 <= len(text) / count_tokens(text) <= 5.0


def test_vllm_reset_prefix_cache_makes_the_next_turn_cold(start_emulator: StartEmulator) -> None:
    """vLLM's dev-mode POST /reset_prefix_cache: a benchmark starts each workload cold."""
    server = start_emulator("vllm")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Plan Rome"}]
    with client(server) as sdk:

        def ask() -> CompletionUsage | None:
            return sdk.chat.completions.create(model=model_of(server), messages=messages).usage  # type: ignore[arg-type]

        ask()
        warm = ask()
        status, _, body = raw(server, "POST", "/reset_prefix_cache")
        cold = ask()
    assert warm is not None
    assert warm.prompt_tokens_details is not None
    assert warm.prompt_tokens_details.cached_tokens
    assert (status, body) == (200, b'{"success": true}')
    assert cold is not None
    assert cold.prompt_tokens_details is not None
    assert cold.prompt_tokens_details.cached_tokens == 0


def test_only_the_vllm_profile_serves_reset_prefix_cache(start_emulator: StartEmulator) -> None:
    assert raw(start_emulator("hosted"), "POST", "/reset_prefix_cache")[0] == 404
