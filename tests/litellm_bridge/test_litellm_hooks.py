"""The plugin's hooks without LiteLLM: data shaped as LiteLLM's proxy passes it, a fake router."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.litellm_bridge.plugin import (
    BACKEND_HEADER,
    GENERATION_HEADER,
    KvmigrateRouter,
)
from kvmigrate.recorder.evidence import open_controller


def _config(
    tmp_path: Path, mode: str = "shadow", percent: float = 0, content: str = "full"
) -> Config:
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:1/v1"}}
  vllm: {{api_base: "http://127.0.0.1:2/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: vllm-llama}}
rollout:
  mode: {mode}
  percent: {percent}
  noise_sample: 0
  state: sqlite:///{tmp_path}/state.db
record:
  db: sqlite:///{tmp_path}/records.db
  content: {content}
""",
        str(tmp_path / "config.yaml"),
    )


def _data(call_id: str, stream: bool = False, session: str = "s-1") -> dict[str, Any]:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
    }
    headers = {"x-session-id": session, "authorization": "Bearer sk"}
    return {
        **body,
        "metadata": {"headers": headers},
        "litellm_call_id": call_id,
        "proxy_server_request": {"headers": headers, "body": {**body, "metadata": {}}},
    }


def _answer(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    }


class FakeRouter:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def acompletion(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if kwargs.get("stream"):
            return self._stream()
        return _answer("the candidate says hello")

    async def aresponses(self, **kwargs: Any) -> Any:
        raise AssertionError("not used")

    async def _stream(self) -> AsyncIterator[dict[str, Any]]:
        for piece in ("the candidate ", "says hello"):
            yield {"object": "chat.completion.chunk", "choices": [{"delta": {"content": piece}}]}
        yield {
            "object": "chat.completion.chunk",
            "choices": [{"delta": {}, "finish_reason": "stop"}],
        }


def _logged(call_id: str, group: str) -> dict[str, Any]:
    now = datetime.now()
    return {
        "litellm_call_id": call_id,
        "litellm_params": {"metadata": {"model_group": group}},
        "api_call_start_time": now - timedelta(milliseconds=30),
        "completion_start_time": now - timedelta(milliseconds=10),
    }


def _rows(
    tmp_path: Path, until: Callable[[list[sqlite3.Row]], bool], content: str = "full"
) -> list[sqlite3.Row]:
    """The records, once `until` holds of them. `aclose` gives the recorder's worker, which
    runs at the lowest priority, a bounded time; on a busy machine what it has not written
    by then stays in its spool for the next start. So, while records are missing, start the
    plugin again, as LiteLLM's next start would, and let its recorder replay the spool: no
    record may be lost either way (generous deadline, as the LiteLLM proxy tests' 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        rows = _read_records(tmp_path)
        if until(rows):
            return rows
        assert time.monotonic() < deadline, [tuple(r) for r in rows]
        _next_start(tmp_path, content, lambda: until(_read_records(tmp_path)) or (
            time.monotonic() > deadline))  # fmt: skip


def _read_records(tmp_path: Path) -> list[sqlite3.Row]:
    with contextlib.closing(sqlite3.connect(tmp_path / "records.db", timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        tables = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'records'")
        return list(conn.execute("SELECT * FROM records ORDER BY ts")) if any(tables) else []


def _next_start(tmp_path: Path, content: str, done: Callable[[], bool]) -> None:
    """A plugin started and stopped again, its recorder replaying what the last one spooled."""
    plugin = KvmigrateRouter(_config(tmp_path, content=content), router=FakeRouter())
    assert plugin.recorder is not None
    plugin.recorder.start()
    try:
        while not done():
            time.sleep(0.05)
    finally:
        plugin.close()


def _served(count: int) -> Callable[[list[sqlite3.Row]], bool]:
    return lambda rows: sum(r["role"] == "serve" for r in rows) >= count


@pytest.mark.parametrize("stream", [False, True])
def test_shadow_mode_records_the_answer_and_a_scored_copy(tmp_path: Path, stream: bool) -> None:
    router = FakeRouter()

    async def run() -> None:
        plugin = KvmigrateRouter(_config(tmp_path), router=router)
        data = _data("call-1", stream)
        result = await plugin.async_pre_call_hook(None, None, data, "acompletion")
        assert result is data
        assert data["model"] == "gpt-4o-mini"
        assert "fallbacks" not in data
        headers = await plugin.async_post_call_response_headers_hook(data, None, None)
        # The generation it routes by: the store's, unchanged since the plugin read it.
        generation = str(plugin.store.version())
        assert headers == {BACKEND_HEADER: "hosted", GENERATION_HEADER: generation}
        now = datetime.now()
        kwargs = _logged("call-1", "gpt-4o-mini")
        await plugin.async_log_success_event(kwargs, _answer("hello there"), now, now)
        await plugin.aclose()
        assert router.calls[0]["model"] == "vllm-llama"
        assert router.calls[0]["messages"] == data["messages"]
        assert "metadata" not in router.calls[0]

    asyncio.run(run())
    rows = _rows(tmp_path, lambda rows: len(rows) >= 2)
    assert [(r["role"], r["backend"]) for r in rows] == [("serve", "hosted"), ("shadow", "vllm")]
    serve, shadow = rows
    assert shadow["pair_id"] == serve["request_id"]
    assert shadow["parity_kind"] == "candidate"
    assert shadow["parity_score"] is not None
    if stream:
        assert serve["ttft_ms"] == pytest.approx(20, abs=5)
        assert shadow["ttft_ms"] is not None
    else:  # a whole answer has a latency, not a TTFT
        assert serve["ttft_ms"] is None
    assert serve["latency_ms"] is not None
    assert serve["completion_tokens"] == 3


def test_a_copy_is_recorded_in_its_answers_conversation(tmp_path: Path) -> None:
    """Redacted records name a declared session by the store's hash of it, once the
    store's keys are read. The copy must carry its answer's name: the recorder pairs a copy
    with its answer (the parity score) within one lane, chosen by that name."""
    router = FakeRouter()

    async def run() -> None:
        plugin = KvmigrateRouter(_config(tmp_path, content="redacted"), router=router)
        deadline = time.monotonic() + 30
        while not plugin.identity.in_store("s-1"):  # the keys, read off the loop
            assert time.monotonic() < deadline, "the store's keys were never read"
            await asyncio.sleep(0.01)
        data = _data("call-1")
        await plugin.async_pre_call_hook(None, None, data, "acompletion")
        now = datetime.now()
        kwargs = _logged("call-1", "gpt-4o-mini")
        await plugin.async_log_success_event(kwargs, _answer("hello there"), now, now)
        await plugin.aclose()

    asyncio.run(run())
    serve, shadow = _rows(tmp_path, lambda rows: len(rows) >= 2, content="redacted")
    assert (serve["role"], shadow["role"]) == ("serve", "shadow")
    assert shadow["conversation"] == serve["conversation"]
    assert serve["conversation"].startswith("k:")
    assert "s-1" not in serve["conversation"]
    assert shadow["parity_kind"] == "candidate"


def test_split_points_litellm_at_the_candidate_group_with_the_primary_as_fallback(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, mode="split", percent=100)
    open_controller(config).store.close()  # the store starts from the config's rollout

    async def run() -> dict[str, Any]:
        plugin = KvmigrateRouter(config, router=FakeRouter(), record=False)
        data = _data("call-2")
        await plugin.async_pre_call_hook(None, None, data, "acompletion")
        await plugin.aclose()
        return data

    data = asyncio.run(run())
    assert data["model"] == "vllm-llama"
    assert data["fallbacks"] == ["gpt-4o-mini"]
    assert data["metadata"]["kvmigrate_backend"] == "vllm"


def test_a_failing_plugin_never_breaks_the_request(tmp_path: Path) -> None:
    async def run() -> tuple[dict[str, Any], int]:
        plugin = KvmigrateRouter(_config(tmp_path), router=FakeRouter(), record=False)

        async def broken(*_args: Any) -> Any:
            raise RuntimeError("store exploded")

        plugin.live.route = broken  # type: ignore[method-assign]
        data = _data("call-3")
        result = await plugin.async_pre_call_hook(None, None, data, "acompletion")
        await plugin.async_log_success_event({"litellm_call_id": 7}, object(), None, None)
        await plugin.async_log_failure_event({}, None, None, None)
        # A request it did not route gets no backend header, only the generation.
        headers = await plugin.async_post_call_response_headers_hook({}, None, None)
        assert headers == {GENERATION_HEADER: str(plugin.store.version())}
        await plugin.aclose()
        return result, plugin.hook_errors

    data, errors = asyncio.run(run())
    assert data["model"] == "gpt-4o-mini"  # untouched: LiteLLM routes it itself
    assert errors == 1


def test_calls_the_plugin_does_not_route_are_left_alone(tmp_path: Path) -> None:
    async def run() -> list[dict[str, Any]]:
        plugin = KvmigrateRouter(_config(tmp_path), router=FakeRouter(), record=False)
        unmapped = {**_data("call-4"), "model": "some-other-model"}
        embedding = {**_data("call-5"), "input": "x"}
        await plugin.async_pre_call_hook(None, None, unmapped, "acompletion")
        await plugin.async_pre_call_hook(None, None, embedding, "aembedding")
        await plugin.aclose()
        return [unmapped, embedding]

    unmapped, embedding = asyncio.run(run())
    assert unmapped["model"] == "some-other-model"
    assert embedding["model"] == "gpt-4o-mini"
    assert "kvmigrate_backend" not in embedding["metadata"]


def _turn(call_id: str, context: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """A request with no session id and a system prompt that changes every turn."""
    messages = [{"role": "system", "content": f"Notes: {context}"}, *history]
    body = {"model": "gpt-4o-mini", "messages": messages}
    headers = {"authorization": "Bearer sk"}
    return {
        **body,
        "metadata": {"headers": headers},
        "litellm_call_id": call_id,
        "proxy_server_request": {"headers": headers, "body": {**body, "metadata": {}}},
    }


def test_the_plugin_keys_a_later_turn_by_the_answer_it_resends(tmp_path: Path) -> None:
    async def run() -> None:
        plugin = KvmigrateRouter(_config(tmp_path), router=FakeRouter())
        history: list[dict[str, Any]] = [{"role": "user", "content": "plan my day"}]
        for turn, context in enumerate(("museums rank high", "beaches rank low"), start=1):
            data = _turn(f"call-{turn}", context, history)
            await plugin.async_pre_call_hook(None, None, data, "acompletion")
            now = datetime.now()
            kwargs = _logged(f"call-{turn}", "gpt-4o-mini")
            await plugin.async_log_success_event(kwargs, _answer(f"answer {turn}"), now, now)
            history += [
                {"role": "assistant", "content": f"answer {turn}"},
                {"role": "user", "content": "and then?"},
            ]
        await plugin.aclose()

    asyncio.run(run())
    served = [r for r in _rows(tmp_path, _served(2)) if r["role"] == "serve"]
    assert [(r["turn"], r["identity"]) for r in served] == [(1, "opening"), (2, "continuity")]
    assert served[0]["conversation"] == served[1]["conversation"]


def test_every_candidate_of_the_model_gets_its_own_copy(tmp_path: Path) -> None:
    """Several candidates, as the proxy shadows them: a copy to each candidate's group."""
    router = FakeRouter()
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:1/v1"}}
  vllm: {{api_base: "http://127.0.0.1:2/v1"}}
  vllm-fp8: {{api_base: "http://127.0.0.1:3/v1"}}
models:
  - model_name: gpt-4o-mini
    hosted: gpt-4o-mini
    vllm: vllm-llama
    vllm-fp8: vllm-llama-fp8
    candidates: [vllm, vllm-fp8]
rollout:
  mode: shadow
  noise_sample: 0
  state: sqlite:///{tmp_path}/state.db
record:
  db: sqlite:///{tmp_path}/records.db
""",
        str(tmp_path / "config.yaml"),
    )

    async def run() -> None:
        plugin = KvmigrateRouter(config, router=router)
        data = _data("call-1")
        await plugin.async_pre_call_hook(None, None, data, "acompletion")
        assert data["model"] == "gpt-4o-mini"
        now = datetime.now()
        await plugin.async_log_success_event(
            _logged("call-1", "gpt-4o-mini"), _answer("hello there"), now, now
        )
        await plugin.aclose()

    asyncio.run(run())
    assert sorted(call["model"] for call in router.calls) == ["vllm-llama", "vllm-llama-fp8"]
    rows = _rows(tmp_path, lambda rows: len(rows) >= 3)
    assert sorted((r["role"], r["backend"], r["served_model"]) for r in rows) == [
        ("serve", "hosted", "gpt-4o-mini"),
        ("shadow", "vllm", "vllm-llama"),
        ("shadow", "vllm-fp8", "vllm-llama-fp8"),
    ]
    serve = next(r for r in rows if r["role"] == "serve")
    assert {r["pair_id"] for r in rows if r["role"] == "shadow"} == {serve["request_id"]}
