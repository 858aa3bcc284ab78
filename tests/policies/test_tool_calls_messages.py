"""The candidate's broken tool calls, the auto-rollback signal, read from Messages answers
as from chat ones: a tool the request did not offer, or an input that never became a JSON
object (a stream cut inside it)."""

from __future__ import annotations

from typing import Any

import messages_wire as mw
import pytest

from kvmigrate.policies.tool_calls import TOOL_ROUTES, invalid_tool_calls
from kvmigrate.wire.assemble import assemble

REQUEST = mw.request([{"role": "user", "content": "Weather in Paris?"}], tools=[mw.WEATHER_TOOL])


def _streamed(content: list[dict[str, Any]]) -> dict[str, Any]:
    answer = assemble("messages", mw.stream(mw.message(content, stop_reason="tool_use")))
    assert answer is not None
    return answer


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ([mw.tool_use("get_weather", {"location": "Paris"}, "toolu_01")], (1, 0)),
        ([mw.text("Let me check."), mw.tool_use("get_time", {}, "toolu_02")], (1, 1)),
        ([mw.tool_use("get_weather", {"location": "Paris"}, "toolu_03")] * 2, (2, 0)),
        ([mw.text("It is sunny.")], (0, 0)),
    ],
)
def test_messages_tool_calls_are_counted_and_judged(
    content: list[dict[str, Any]], expected: tuple[int, int]
) -> None:
    assert invalid_tool_calls(REQUEST, _streamed(content)) == expected
    assert invalid_tool_calls(REQUEST, mw.message(content)) == expected


def test_a_tool_input_cut_off_mid_stream_is_invalid() -> None:
    wire = mw.stream(mw.message([mw.tool_use("get_weather", {"location": "Paris"}, "toolu_04")]))
    first_piece = wire.index(b'"partial_json":"{')
    cut = wire[: wire.index(b"\n\n", first_piece)]  # the input's first 5 characters only
    answer = assemble("messages", cut)
    assert answer is not None
    assert invalid_tool_calls(REQUEST, answer) == (1, 1)


def test_the_watcher_reads_messages_answers() -> None:
    assert "messages" in TOOL_ROUTES
