"""The decode-speed gate and the per-stream speed it reads: pure functions, as tables."""

from __future__ import annotations

import pytest

from kvmigrate.policies.decode_gate import decode_gate
from kvmigrate.policies.decode_speed import StreamSpeed, stream_speed
from kvmigrate.policies.gates import GateConfig, Verdict, evaluate_gates, gates_off
from kvmigrate.policies.window import BackendWindow


@pytest.mark.parametrize(
    ("tokens", "decode_ms", "chunks", "gap_ms", "expected"),
    [
        (101, 2000.0, 100, 80.0, StreamSpeed(50.0, 20.0, 20.0, 80.0)),
        (11, 100.0, 5, None, StreamSpeed(100.0, 10.0, 20.0, 0.0)),
        (2, 10.0, 1, 10.0, StreamSpeed(100.0, 10.0, 10.0, 10.0)),
        (None, 2000.0, 100, 80.0, None),  # no usage: no token count
        (1, 2000.0, 100, 80.0, None),  # one token: nothing after the first
        (0, 2000.0, 100, 80.0, None),
        (101, None, 100, 80.0, None),  # not a stream
        (101, 0.0, 100, 0.0, None),  # the whole answer in one chunk
        (101, 2000.0, 0, 0.0, None),
        (101, 2000.0, None, None, None),
    ],
)
def test_stream_speed(
    tokens: int | None,
    decode_ms: float | None,
    chunks: int | None,
    gap_ms: float | None,
    expected: StreamSpeed | None,
) -> None:
    assert stream_speed(tokens, decode_ms, chunks, gap_ms) == expected


def window(
    speeds: tuple[float, ...], requests: int = 400, conversations: int = 40
) -> BackendWindow:
    return BackendWindow("vllm", requests, conversations, tps_sample=speeds)


SPREAD = tuple(40.0 + i % 21 for i in range(400))  # 40..60, median 50
CONFIG = GateConfig(tps_p50_min=50.0)


@pytest.mark.parametrize(
    ("candidate", "config", "verdict", "detail"),
    [
        (window((80.0,) * 400), CONFIG, Verdict.PASSED, "candidate 80.0 tok/s per stream, p50 [80.0, 80.0] vs 50"),
        (window((30.0,) * 400), CONFIG, Verdict.FAILED, "candidate 30.0 tok/s per stream, p50 [30.0, 30.0] vs 50"),
        (window((50.0,) * 400), CONFIG, Verdict.PASSED, "candidate 50.0 tok/s per stream, p50 [50.0, 50.0] vs 50"),
        (window(SPREAD), CONFIG, Verdict.INCONCLUSIVE, "candidate 50.0 tok/s per stream, p50 [48.0, 52.0] vs 50 (rollout.gates.tps_p50_min); about 749 more conversations"),
        (window(tuple(s + 30 for s in SPREAD)), CONFIG, Verdict.PASSED, "candidate 80.0 tok/s"),
        (window((), requests=400), CONFIG, Verdict.INCONCLUSIVE, "no candidate stream with decode timing and usage yet; have 400 requests"),
        (window((80.0,) * 50, requests=50), CONFIG, Verdict.INCONCLUSIVE, "need 100 candidate requests (rollout.gates.min_requests) before decode speed counts; have 50"),
    ],
)  # fmt: skip
def test_decode_gate(
    candidate: BackendWindow, config: GateConfig, verdict: Verdict, detail: str
) -> None:
    result = decode_gate(candidate, config)
    assert (result.name, result.verdict, result.threshold) == ("decode_speed", verdict, 50.0)
    assert result.detail.startswith(detail), result.detail
    if candidate.tps_sample and candidate.requests >= config.min_requests:
        assert result.low is not None
        assert result.high is not None
        assert result.low <= (result.estimate or 0) <= result.high
        assert result.figures["streams"] == len(candidate.tps_sample)


def test_the_gate_is_off_unless_set_and_says_so() -> None:
    primary, candidate = BackendWindow("hosted", 400, 40), window((80.0,) * 400)
    names = [r.name for r in evaluate_gates(primary, candidate, GateConfig())]
    assert "decode_speed" not in names
    shown = [r.to_dict() for r in evaluate_gates(primary, candidate, GateConfig())]
    off = {g["name"]: g["detail"] for g in gates_off(shown)}
    assert off["decode_speed"] == "off (rollout.gates.tps_p50_min not set)"
    results = evaluate_gates(primary, candidate, CONFIG)
    assert [r.name for r in results][-1] == "decode_speed"
    assert results[-1].verdict is Verdict.PASSED
