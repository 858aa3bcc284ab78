"""The recorder behind a real proxy in front of emulated backends: what lands in the DB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorder_support import (
    HOSTED_MODEL,
    WEATHER_TOOL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

from kvmigrate.recorder import open_store
from kvmigrate.recorder.convert import stored_conversation
from kvmigrate.recorder.history import inflate_rows
from kvmigrate.recorder.sqlite_store import SqliteStore


def _conversation(client, session: str, turns: int, stream: bool = False) -> None:  # type: ignore[no-untyped-def]
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi, I am jane.roe@example.com, card 4111 1111 1111 1111."},
    ]
    for _ in range(turns):
        kwargs = {"stream_options": {"include_usage": True}} if stream else {}
        result = client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, max_tokens=12, stream=stream,
            extra_headers={"X-Session-ID": session}, **kwargs,
        )  # fmt: skip
        text = (
            "".join(c.choices[0].delta.content or "" for c in result if c.choices)
            if stream
            else result.choices[0].message.content
        )
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]


def test_serve_and_shadow_calls_are_recorded_with_pairs_turns_and_tokens(
    backends: Backends, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    proxy = start_recording_proxy(recorder_config(backends.hosted.url, backends.vllm.url, db))
    client = proxy.client()
    _conversation(client, "conv-a", 3)
    _conversation(client, "conv-b", 2, stream=True)
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 10)
    proxy.stop()

    with open_store(db) as store:
        rows = store.query(
            "SELECT request_id, role, backend, conversation, turn, status, error, ttft_ms, "
            "latency_ms, prompt_tokens, cached_tokens, completion_tokens, finish_reason, pair_id, "
            "request_json, response_json, stream, request_messages FROM records ORDER BY ts"
        )
        # The history is stored once per message; put each request back together.
        requests = inflate_rows(store, [(r[14], r[17]) for r in rows])
    rows = [(*r[:14], json.dumps(body), *r[15:]) for r, body in zip(rows, requests, strict=True)]
    serve = [r for r in rows if r[1] == "serve"]
    shadow = [r for r in rows if r[1] == "shadow"]
    assert len(serve) == 5
    assert len(shadow) == 5
    assert {r[2] for r in serve} == {"hosted"}
    assert {r[2] for r in shadow} == {"vllm"}
    # Each shadow copy points at the primary answer it copies.
    assert {r[13] for r in shadow} == {r[0] for r in serve}
    # Redacted records keep a keyed hash of an X-Session-ID, the same for every turn.
    key = proxy.recorder.hash_key
    a, b = (stored_conversation(c, "redacted", key) for c in ("conv-a", "conv-b"))
    assert sorted((r[3], r[4]) for r in serve) == sorted([(a, 1), (a, 2), (a, 3), (b, 1), (b, 2)])
    for r in rows:
        assert r[5] == 200
        assert r[6] is None
        if r[16]:  # streamed: TTFT is the first byte, within the latency
            assert 0 < r[7] <= r[8]
        else:  # a non-streamed answer arrives whole: no TTFT, only latency
            assert r[7] is None
            assert r[8] > 0
        assert r[9] > 0
        assert r[11] > 0
        assert r[12] == "length"
    # The emulated vLLM caches the prefix: later turns of a conversation hit it.
    assert any(r[10] > 0 for r in shadow if r[4] > 1)
    # Redacted by default: the email and the card never reach the disk.
    for r in rows:
        assert "jane.roe@example.com" not in r[14]
        assert "4111 1111" not in r[14]
        assert "[EMAIL]" in r[14]
        assert "[CARD]" in r[14]
    # A streamed answer is stored reassembled into the non-streamed shape.
    streamed = [r for r in serve if r[16]]
    assert streamed
    for r in streamed:
        response = json.loads(r[15])
        assert response["object"] == "chat.completion"
        assert response["choices"][0]["message"]["content"]
        assert response["usage"]["completion_tokens"] == r[11]


def test_tool_call_names_are_recorded_from_streams_and_bodies(
    backends: Backends, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    proxy = start_recording_proxy(recorder_config(backends.hosted.url, backends.vllm.url, db))
    client = proxy.client()
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for stream in (False, True):
        result = client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="required",
            stream=stream, max_tokens=30,
        )  # fmt: skip
        if stream:
            list(result)
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 4)
    proxy.stop()
    with open_store(db) as store:
        rows = store.query("SELECT role, stream, tool_calls, finish_reason FROM records")
    assert len(rows) == 4
    for _role, _stream, tools, finish in rows:
        assert json.loads(tools) == ["get_weather"]
        assert finish == "tool_calls"


@pytest.mark.parametrize("content", ["none", "full"])
def test_content_policy(backends: Backends, tmp_path: Path, content: str) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    config = recorder_config(backends.hosted.url, backends.vllm.url, db, content=content)
    proxy = start_recording_proxy(config)
    _conversation(proxy.client(), "conv", 1)
    proxy.stop()
    with open_store(db) as store:
        rows = store.query(
            "SELECT content, request_json, response_json, prompt_tokens, request_messages "
            "FROM records"
        )
        requests = inflate_rows(store, [(r[1], r[4]) for r in rows])
    assert len(rows) == 2
    for (policy, stored, response, prompt, _refs), request in zip(rows, requests, strict=True):
        assert policy == content
        assert prompt > 0
        if content == "none":
            assert stored is None
            assert request is None
            assert response is None
        else:
            assert "jane.roe@example.com" in json.dumps(request)
            assert json.loads(response)["choices"]


def test_metrics_and_flush_on_shutdown(backends: Backends, tmp_path: Path) -> None:
    """A long flush interval holds the batch open: `done()` at shutdown must still write it."""
    db = f"sqlite:///{tmp_path}/records.db"
    config = recorder_config(backends.hosted.url, backends.vllm.url, db)
    proxy = start_recording_proxy(config, flush_interval=60.0)
    _conversation(proxy.client(), "conv", 2)
    import urllib.request

    def metrics() -> str:
        return urllib.request.urlopen(proxy.url + "/metrics", timeout=5).read().decode()

    wait_until(lambda: "kvmigrate_recorder_queue_depth" in metrics())
    text = metrics()
    assert "kvmigrate_records_written_total 0.0" in text
    assert 'kvmigrate_records_dropped_total{reason="queue_full"} 0.0' in text
    assert "kvmigrate_recorder_write_errors_total 0.0" in text
    proxy.stop()
    assert proxy.recorder.stats.written == 4
    with SqliteStore(db) as store:
        assert store.query("SELECT count(*) FROM records") == [(4,)]
        assert store.integrity_check() == "ok"


def test_two_workers_keep_each_conversation_and_its_shadow_pairs_together(
    backends: Backends, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    config = recorder_config(backends.hosted.url, backends.vllm.url, db, workers=2)
    proxy = start_recording_proxy(config)
    client = proxy.client()
    for n in range(6):
        _conversation(client, f"conv-{n}", 2, stream=n % 2 == 0)
    proxy.stop()
    assert proxy.recorder.stats.written == 24
    with open_store(db) as store:
        sources = store.query("SELECT DISTINCT source FROM records")
        shadow = store.query("SELECT parity_kind, parity_score FROM records WHERE role = 'shadow'")
        messages = store.query("SELECT count(*) FROM messages")[0][0]
    assert len(sources) == 1  # one proxy, however many workers write for it
    # Every copy met the answer it copies, in whichever worker had its conversation.
    assert len(shadow) == 12
    assert all(kind == "candidate" and score is not None for kind, score in shadow)
    # Each conversation's history is stored once: 2 opening messages shared by all, plus
    # per conversation one answer and one "go on" (answers may repeat across them).
    assert messages <= 2 + 6 * 2
