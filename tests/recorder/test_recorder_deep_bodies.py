"""A body the proxy serves is recorded, however deeply it nests: orjson reads 1,024 levels
but writes 255, and every record of such a request (serve and shadow) was dropped as
invalid, so a client could keep its traffic out of every report and gate. A record that
cannot be converted is logged by its request id only: the item holds the unredacted body."""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

from kvmigrate.exchange import Exchange, Role
from kvmigrate.recorder import RecorderAddon, WriterSettings, open_store
from kvmigrate.recorder.convert import TOO_DEEP, RecordConverter
from kvmigrate.recorder.crossing import WorkerSpec
from kvmigrate.recorder.worker import ProcessWriter
from kvmigrate.recorder.writer import RecordWriter, WriterStats

EMAIL = "carol@example.com"


def test_a_request_nested_past_what_orjson_writes_is_recorded_with_a_marker(
    backends: Backends, tmp_path: Path
) -> None:
    db = tmp_path / "records.db"
    proxy = start_recording_proxy(
        recorder_config(backends.hosted.url, backends.vllm.url, f"sqlite:///{db}")
    )
    deep: object = "bottom"
    for _ in range(300):
        deep = [deep]
    proxy.client().chat.completions.create(
        model=HOSTED_MODEL,
        messages=[{"role": "user", "content": f"write to {EMAIL}"}],
        extra_body={"metadata_tree": deep},
    )
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 2)
    proxy.stop()

    assert proxy.recorder.stats.dropped == {}
    with open_store(f"sqlite:///{db}") as store:
        rows = store.query("SELECT role, status, request_json FROM records ORDER BY role")
    assert [(role, status) for role, status, _ in rows] == [("serve", 200), ("shadow", 200)]
    for _, _, request_json in rows:
        assert TOO_DEEP in request_json
        assert EMAIL not in request_json  # still redacted


def test_an_item_that_cannot_be_converted_is_logged_without_its_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = RecorderAddon(f"sqlite:///{tmp_path}/r.db", worker="thread")
    recorder.start()
    with caplog.at_level(logging.DEBUG, logger="kvmigrate.recorder"):
        recorder._writer.submit((f"a body naming {EMAIL}", 0.0))
        recorder.close()
    assert recorder.stats.dropped == {"invalid": 1}
    assert "cannot convert" in caplog.text
    assert EMAIL not in caplog.text


def _nested(depth: int) -> bytes:
    """`depth` lists around a string, as text: the stdlib and orjson both refuse to write it."""
    return b"[" * depth + b'"bottom"' + b"]" * depth


def test_a_request_nested_as_deep_as_the_proxy_accepts_is_recorded(
    backends: Backends, tmp_path: Path
) -> None:
    """1,000 levels: within orjson's 1,024, so the proxy forwards it, but past Python's
    recursion limit, where splitting off the history (msgspec) gives up: the request is
    stored whole. The emulator, like many a server, cannot parse it either and answers
    500; whatever the answer, the exchange is recorded."""
    db = tmp_path / "records.db"
    proxy = start_recording_proxy(
        recorder_config(backends.hosted.url, backends.vllm.url, f"sqlite:///{db}")
    )
    body = orjson.dumps(
        {"model": HOSTED_MODEL, "messages": [{"role": "user", "content": f"mail {EMAIL}"}]}
    )
    body = body[:-1] + b',"metadata_tree":' + _nested(1000) + b"}"
    request = urllib.request.Request(
        proxy.url + "/v1/chat/completions",
        data=body,
        headers={"content-type": "application/json", "authorization": "Bearer sk-client"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            status = answer.status
    except urllib.error.HTTPError as refused:
        status = refused.code
    wait_until(lambda: _settled(proxy.recorder.stats) >= 1)
    proxy.stop()

    assert proxy.recorder.stats.dropped == {}
    with open_store(f"sqlite:///{db}") as store:
        rows = store.query("SELECT role, status, request_json, pair_id FROM records ORDER BY role")
    # A failed answer has no shadow copy; one that succeeds would, recorded alike.
    assert rows[0][:2] == ("serve", status)
    assert all(code == status for _, code, _, _ in rows)
    for _, _, request_json, _ in rows:
        assert TOO_DEEP in request_json
        assert "[EMAIL]" in request_json  # the history is inline, and still redacted
        assert EMAIL not in request_json


def _settled(stats: WriterStats) -> int:
    """Records written or dropped: the recorder is done with them either way."""
    return stats.written + sum(stats.dropped.values())


def _exchange(request_id: str, role: Role, answer: bytes, pair_id: str | None = None) -> Exchange:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    exchange = Exchange(
        request_id, "messages", "hosted", role, "m", "m", "c", 1, False, 0.0,
        request_body=body, status=200, finished=0.5, pair_id=pair_id,
        has_shadow_copy=pair_id is None,
    )  # fmt: skip
    exchange.chunks = [answer]
    return exchange


def test_a_pair_whose_answers_nest_too_deep_to_score_is_kept_unscored() -> None:
    """A tool call's input 300 levels deep: the comparators cannot encode it. The pair is
    kept, as one that could not be scored, with the exchange's own facts."""
    answer = (
        b'{"type":"message","role":"assistant","stop_reason":"tool_use",'
        b'"usage":{"input_tokens":3,"output_tokens":4},"content":[{"type":"tool_use",'
        b'"id":"t1","name":"lookup","input":{"tree":' + _nested(300) + b"}}]}"
    )
    convert = RecordConverter("redacted", "test")
    convert((_exchange("r1", Role.SERVE, answer), 0.0))
    copy = convert((_exchange("r2", Role.SHADOW, answer, pair_id="r1"), 0.0))
    assert (copy.status, copy.pair_id, copy.completion_tokens) == (200, "r1", 4)
    assert (copy.parity_kind, copy.parity_score, copy.parity_applicable) == (
        "candidate",
        None,
        "[]",
    )
    assert copy.response_json is not None
    assert TOO_DEEP in copy.response_json


def _personal_exchange() -> Exchange:
    exchange = _exchange("req-7\nFORGED", Role.SERVE, b"{}")
    exchange.request_body = f'{{"user":"{EMAIL}"}}'.encode()
    return exchange


def test_a_failed_conversion_is_logged_by_request_id_and_sizes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(item: object) -> None:
        raise ValueError(f"cannot read {EMAIL}")  # an error that quotes the content

    writer = RecordWriter(lambda: open_store(f"sqlite:///{tmp_path}/r.db"), refuse)
    with caplog.at_level(logging.DEBUG, logger="kvmigrate.recorder"):
        writer.write_batch([(_personal_exchange(), 0.0)])
    writer.stop()
    assert writer.stats.dropped == {"invalid": 1}
    [line] = [r.getMessage() for r in caplog.records if "cannot convert" in r.getMessage()]
    assert "request req-7\\nFORGED (28 request bytes, 2 answer bytes)" in line
    assert "ValueError" in line
    assert EMAIL not in caplog.text
    assert "\n" not in line


def test_an_exchange_that_cannot_cross_to_a_worker_is_logged_without_its_content(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = ProcessWriter(
        WorkerSpec(f"sqlite:///{tmp_path}/r.db", "redacted", "test", None, WriterSettings())
    )
    exchange = _personal_exchange()
    exchange.chunks = [EMAIL]  # type: ignore[list-item]  # not bytes: it cannot be packed
    with caplog.at_level(logging.DEBUG, logger="kvmigrate.recorder"):
        writer.start()
        writer.submit((exchange, 0.0))
        writer.stop()
    [line] = [r.getMessage() for r in caplog.records if "cannot pack" in r.getMessage()]
    assert "request req-7\\nFORGED" in line
    assert EMAIL not in caplog.text
