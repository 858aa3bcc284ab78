"""A recorded answer of any shape is shown, never a crash of the whole report: the hosted
API's custom tool calls (`{"type": "custom", "custom": {...}}`), or a candidate's malformed
answer, sit in the parity section's worst pairs and in the divergences view."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmigrate.recorder import Record, open_store
from kvmigrate.report import RENDERERS, build_report

CUSTOM_CALL = (
    '{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":'
    '[{"id":"c1","type":"custom","custom":{"name":"apply_patch","input":"*** x"}}]}}]}'
)


def _pair(answer: str) -> list[Record]:
    now = time.time()

    def call(request_id: str, backend: str, role: str) -> Record:
        return Record(request_id, now - 5, "chat/completions", backend, role, "m", "m", "c", 1,
                      False, 200, latency_ms=5.0, content="redacted", response_json=answer)  # fmt: skip

    shadow = call("s1", "vllm", "shadow")
    shadow.pair_id, shadow.parity_kind, shadow.parity_score = "p1", "candidate", 0.2
    shadow.parity_disagree = '["tool_calls"]'
    return [call("p1", "hosted", "serve"), shadow]


@pytest.mark.parametrize(
    "answer",
    [
        CUSTOM_CALL,
        '{"choices":[{"message":{"tool_calls":[{"function":null}]}}]}',
        '{"choices":[{"message":"plain words"}]}',
    ],
)
def test_any_recorded_answer_shape_renders_in_every_format(tmp_path: Path, answer: str) -> None:
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert(_pair(answer))
        report = build_report(store, since=0)
    assert report.divergent_total == 1
    for render in RENDERERS.values():
        assert render(report)


def test_a_chat_answer_is_its_text_or_its_tool_calls(tmp_path: Path) -> None:
    answer = '{"choices":[{"message":{"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}}]}'
    with open_store(f"sqlite:///{tmp_path / 'r.db'}") as store:
        store.insert(_pair(answer))
        report = build_report(store, since=0)
    assert report.divergences[0].candidate == "tool calls: f({})"
    assert report.parity.worst[0].excerpt == "tool calls: f({})"
