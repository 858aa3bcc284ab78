"""A body the proxy serves is recorded, however deeply it nests: orjson reads 1,024 levels
but writes 255, and every record of such a request (serve and shadow) was dropped as
invalid, so a client could keep its traffic out of every report and gate. A record that
cannot be converted is logged by its request id only: the item holds the unredacted body."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

from kvmigrate.recorder import RecorderAddon, open_store
from kvmigrate.recorder.convert import TOO_DEEP

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
