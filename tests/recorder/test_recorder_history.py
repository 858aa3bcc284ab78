"""A conversation's history is stored once per message, and comes back whole."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from recorder_support import HOSTED_MODEL, Backends, recorder_config, start_recording_proxy

from kvmigrate.proxy.exchange import Exchange
from kvmigrate.recorder import open_store
from kvmigrate.recorder.convert import RecordConverter
from kvmigrate.recorder.export import recorded_requests
from kvmigrate.recorder.history import TOUCH_S, HistoryMemo, SizedLru, _Prefixes
from kvmigrate.recorder.store import RecordStore
from kvmigrate.recorder.writer import RecordWriter, WriterSettings

DAY = 86_400.0


def _agent(client: openai.OpenAI, turns: int) -> list[list[dict[str, Any]]]:
    """An agent that resends its whole history each turn; returns what each turn sent."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 30},
        {"role": "user", "content": "Fix the build; mail jane.roe@example.com when done."},
    ]
    sent = []
    for turn in range(turns):
        sent.append([dict(m) for m in messages])
        answer = client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, max_tokens=16,  # type: ignore[arg-type]
            extra_headers={"X-Session-ID": "agent-1"},
        )  # fmt: skip
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": f"step {turn}: go on"},
        ]
    return sent


@pytest.mark.parametrize("content", ["full", "redacted"])
def test_each_message_is_stored_once_and_requests_export_whole(
    backends: Backends, tmp_path: Path, content: str
) -> None:
    db = f"sqlite:///{tmp_path}/records.db"
    config = recorder_config(backends.hosted.url, backends.vllm.url, db, content=content)
    proxy = start_recording_proxy(config)
    sent = _agent(proxy.client(), turns=12)
    proxy.stop()

    with open_store(db) as store:
        stored = store.query("SELECT count(*), sum(length(body)) FROM messages")[0]
        record_bytes = store.query(
            "SELECT sum(length(request_json) + length(request_messages)) FROM records"
        )[0][0]
        exported = list(recorded_requests(store, 0, time.time() + 60))
    # One row per distinct message sent (the emulator may repeat an answer); the shadow
    # copies share them all.
    distinct = {orjson.dumps(m) for turn in sent for m in turn}
    assert stored[0] == len(distinct) > 12
    whole = sum(len(orjson.dumps(m)) for turn in sent for m in turn) * 2  # serve + shadow
    assert stored[1] + record_bytes < whole / 3, (stored, record_bytes, whole)
    assert [line["body"]["messages"] for line in exported] == [
        _as_stored(turn, content) for turn in sent
    ]
    assert all(line["body"]["model"] == HOSTED_MODEL for line in exported)


def _as_stored(messages: list[dict[str, Any]], content: str) -> list[dict[str, Any]]:
    if content == "full":
        return messages
    text = orjson.dumps(messages).decode().replace("jane.roe@example.com", "[EMAIL]")
    return list(orjson.loads(text))


def _exchange(i: int, body: dict[str, Any], route: str = "chat/completions") -> Exchange:
    now = time.perf_counter()
    x = Exchange(
        request_id=f"req_{i}", route=route, backend="hosted", role="serve", model="m",
        served_model="m", conversation="c", turn=i + 1, stream=False, started=now,
        request_body=orjson.dumps(body), status=200, first_byte=now, finished=now,
    )  # fmt: skip
    x.chunks = [b'{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}']
    return x


def test_the_responses_api_input_list_is_stored_once_per_item(tmp_path: Path) -> None:
    convert = RecordConverter("full", "test")
    items = [{"role": "user", "content": f"message {n}"} for n in range(4)]
    first = convert((_exchange(0, {"model": "m", "input": items[:3]}, "responses"), 1.0))
    second = convert((_exchange(1, {"model": "m", "input": items}, "responses"), 2.0))
    assert len(first.messages) == 3
    assert len(second.messages) == 1  # only the new item
    # A plain-string input has no history to share: stored as it came.
    plain = convert((_exchange(2, {"model": "m", "input": "hello"}, "responses"), 3.0))
    assert plain.request_messages is None
    assert orjson.loads(plain.request_json or "null") == {"model": "m", "input": "hello"}


def test_prune_keeps_every_message_a_kept_record_needs(tmp_path: Path) -> None:
    convert = RecordConverter("full", "test")
    now = time.time()
    shared = {"role": "system", "content": "the same system prompt"}
    old = {"role": "user", "content": "asked long ago"}
    new = {"role": "user", "content": "asked today"}
    records = [
        convert((_exchange(0, {"model": "m", "messages": [shared, old]}), now - 40 * DAY)),
        # The system prompt again, weeks later: its `last_seen` is refreshed.
        convert((_exchange(1, {"model": "m", "messages": [shared, new]}), now - DAY)),
    ]
    assert now - DAY - (now - 40 * DAY) > TOUCH_S
    assert records[1].touched  # seen before, longer than TOUCH_S ago: refreshed
    with open_store(f"sqlite:///{tmp_path}/r.db") as store:
        store.insert(records)
        store.prune(now - 30 * DAY)
        bodies = [orjson.loads(b) for (b,) in store.query("SELECT body FROM messages")]
        exported = list(recorded_requests(store, 0, now))
    assert sorted(m["content"] for m in bodies) == ["asked today", "the same system prompt"]
    assert [line["body"]["messages"] for line in exported] == [[shared, new]]


def _fails_first(url: str) -> Any:
    """Opens real SQLite stores; the first one fails its writes, as a full disk would."""
    opened: list[RecordStore] = []

    def open_next() -> RecordStore:
        store = open_store(url)
        if not opened:

            def full_disk(records: Any) -> None:
                raise OSError("disk full")

            store.insert = full_disk  # type: ignore[method-assign]
        opened.append(store)
        return store

    return open_next


def test_a_failed_batch_makes_the_converter_store_its_messages_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/r.db"
    convert = RecordConverter("full", "test")
    writer = RecordWriter(
        _fails_first(url), convert, WriterSettings(), on_write_error=convert.history.forget
    )
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    writer.write_batch([(_exchange(0, {"model": "m", "messages": messages}), time.time())])
    assert writer.stats.dropped == {"write_error": 1}
    writer.write_batch([(_exchange(1, {"model": "m", "messages": messages}), time.time())])
    with open_store(url) as reader:
        exported = list(recorded_requests(reader, 0, time.time() + 1))
    assert [line["body"]["messages"] for line in exported] == [messages]
    writer.stop()


def _bodies(shape: str) -> list[bytes]:
    """Successive requests of one conversation, in a few shapes a client may send."""
    sys_msg = {"role": "system", "content": "sys"}
    turns = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"m{n}"} for n in range(6)]
    append = [[sys_msg, *turns[: n + 1]] for n in range(6)]
    if shape == "append":
        return [orjson.dumps({"model": "m", "messages": m}) for m in append]
    if shape == "spaced":  # non-compact JSON, as json.dumps writes it
        import json

        return [json.dumps({"messages": m, "model": "m"}).encode() for m in append]
    if shape == "edited":  # the agent rewrites an earlier message (e.g. trims a tool result)
        edited = [dict(m) for m in append[4]]
        edited[2]["content"] = "rewritten"
        return [orjson.dumps({"messages": m}) for m in (*append[:4], edited, append[5])]
    if shape == "resent":  # the same history twice (a retry), then a shorter one
        return [orjson.dumps({"messages": m}) for m in (append[3], append[3], append[1])]
    raise AssertionError(shape)


@pytest.mark.parametrize("shape", ["append", "spaced", "edited", "resent"])
def test_the_conversation_prefix_shortcut_names_the_same_messages(shape: str) -> None:
    """Digests through the byte-prefix shortcut equal those of the per-message path."""
    shortcut, plain = HistoryMemo(), HistoryMemo()
    for n, body in enumerate(_bodies(shape)):
        fast = shortcut.split("chat/completions", body, float(n), orjson.dumps, "conv-1")
        slow = plain.split("chat/completions", body, float(n), orjson.dumps)
        assert fast is not None
        assert slow is not None
        assert (fast.refs, fast.rest, fast.new) == (slow.refs, slow.rest, slow.new)
    assert fast.refs is not None


def test_the_shortcut_still_refreshes_last_seen() -> None:
    memo = HistoryMemo()
    first, second = _bodies("append")[2:4]
    memo.split("chat/completions", first, 0.0, orjson.dumps, "conv-1")
    later = memo.split("chat/completions", second, TOUCH_S + 1, orjson.dumps, "conv-1")
    assert later is not None
    assert len(later.touched) == 4  # every message seen before, an hour and more ago


def test_a_prefix_checked_again_is_used_again() -> None:
    """Past TOUCH_S a history goes through the per-message path once (refreshing
    `last_seen`); the prefix it leaves must be fresh, or no later turn could use it."""
    prefixes = _Prefixes(1 << 20)
    first, second, third = _bodies("append")[2:5]
    arrays = [orjson.loads(b)["messages"] for b in (first, second, third)]
    raw = [orjson.dumps(a) for a in arrays]
    prefixes.keep("conv-1", raw[0], ["d"] * len(arrays[0]), 0.0, reused=False)
    later = TOUCH_S + 1
    assert prefixes.match("conv-1", raw[1], later) is None  # too old: checked again
    prefixes.keep("conv-1", raw[1], ["d"] * len(arrays[1]), later, reused=False)
    matched = prefixes.match("conv-1", raw[2], later + 1)
    assert matched is not None
    digests, items = matched
    assert len(digests) == len(arrays[1])
    assert items is not None
    assert len(items) == 1


def test_the_rest_of_a_request_is_encoded_once_and_redacted() -> None:
    """Agents resend the same tools and parameters every turn: encoded once, reused while
    identical, and never reused for a request whose rest differs by a byte."""
    calls: list[Any] = []

    def encode(value: Any) -> bytes:
        calls.append(value)
        return orjson.dumps(value).replace(b"jane@example.com", b"[EMAIL]")

    tools = [{"type": "function", "function": {"name": "grep", "description": "x" * 2000}}]
    memo = HistoryMemo()

    def body(turn: int, user: str) -> bytes:
        history = [{"role": "user", "content": f"turn {n}"} for n in range(turn + 1)]
        return orjson.dumps({"model": "m", "tools": tools, "user": user, "messages": history})

    rests = []
    for turn, user in enumerate(["jane@example.com", "jane@example.com", "bob"]):
        split = memo.split("chat/completions", body(turn, user), float(turn), encode, "c1")
        assert split is not None
        rests.append(orjson.loads(split.rest))
    assert rests[0] == rests[1] == {"model": "m", "tools": tools, "user": "[EMAIL]"}
    assert rests[2]["user"] == "bob"
    # Two distinct rests encoded, plus one call per new message (three turns, three new).
    assert sum(1 for c in calls if isinstance(c, dict) and "tools" in c) == 2


def test_the_memos_are_bounded_by_size_least_recently_used_out_first() -> None:
    lru: SizedLru[str, int] = SizedLru(10)
    lru.put("a", 1, 4)
    lru.put("b", 2, 4)
    assert lru.get("a") == 1  # now the most recently used
    lru.put("c", 3, 4)  # 12 > 10: the least recently used goes
    assert (lru.get("b"), lru.get("a"), lru.get("c")) == (None, 1, 3)
    assert (len(lru), lru.size) == (2, 8)
    lru.put("a", 9, 2)  # replacing an entry replaces its size
    assert (lru.get("a"), lru.size) == (9, 6)
    lru.put("huge", 0, 11)  # bigger than the bound: not kept, nothing evicted for it
    assert (lru.get("huge"), len(lru), lru.size) == (None, 2, 6)
    assert lru.pop("c") == 3
    lru.clear()
    assert (len(lru), lru.size, lru.get("a")) == (0, 0, None)


def test_an_export_is_not_shifted_by_records_written_while_it_runs(tmp_path: Path) -> None:
    """Pages follow the sort key, not an offset: a late record (an earlier timestamp,
    written while the export runs) once pushed a row into the next page a second time."""
    from kvmigrate.recorder import Record
    from kvmigrate.recorder.export import PAGE

    def record(i: int, ts: float) -> Record:
        return Record(
            request_id=f"r{i:06d}", ts=ts, route="chat/completions", backend="hosted",
            role="serve", model="m", served_model="m", conversation=f"c{i}", turn=1,
            stream=False, status=200, request_json='{"model": "m", "messages": []}',
        )  # fmt: skip

    db = f"sqlite:///{tmp_path}/records.db"
    with open_store(db) as store:
        store.insert([record(i, 1000.0 + i) for i in range(PAGE + 5)])
        lines = recorded_requests(store, 0, 10_000)
        ids = [next(lines)["custom_id"] for _ in range(PAGE)]
        store.insert([record(999_999, 10.0)])  # late, and before every row exported
        ids += [line["custom_id"] for line in lines]
    assert len(ids) == len(set(ids)) == PAGE + 5
