"""The scorecard's status logic and the TTFT slope across turns: pure functions, as tables."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvmigrate.report.flatness import Slope, slope
from kvmigrate.report.model import BackendSummary, DecodeSummary, Flatness, Report
from kvmigrate.report.scorecard import (
    above,
    at_least,
    below,
    cost_row,
    flat_row,
    gpu_row,
    improvement_row,
    scorecard,
    tps_row,
    ttft_row,
    users_row,
    within,
)
from kvmigrate.report.scorecard_inputs import (
    CostInput,
    GpuInput,
    ScorecardInputs,
    UsersInput,
)
from kvmigrate.report.scorecard_model import Status

MET, MISSED, WAIT, NONE = Status.MET, Status.MISSED, Status.NOT_ENOUGH, Status.NOT_MEASURED


@pytest.mark.parametrize(
    ("judge", "low", "high", "limit", "expected"),
    [
        (below, 100.0, 1999.0, 2000.0, MET),
        (below, 100.0, 2000.0, 2000.0, WAIT),  # touching a strict "under" is not under
        (below, 2000.0, 2500.0, 2000.0, MISSED),
        (below, 1500.0, None, 2000.0, WAIT),  # unbounded above
        (below, None, 1500.0, 2000.0, MET),
        (above, 51.0, 90.0, 50.0, MET),
        (above, 50.0, 90.0, 50.0, WAIT),
        (above, 10.0, 50.0, 50.0, MISSED),
        (above, None, None, 50.0, WAIT),
        (at_least, 0.5, 0.7, 0.5, MET),  # "50%+": touching counts
        (at_least, 0.4, 0.7, 0.5, WAIT),
        (at_least, 0.1, 0.49, 0.5, MISSED),
        (at_least, None, 0.49, 0.5, MISSED),
    ],
)
def test_a_status_is_read_from_the_interval(
    judge: Callable[[float | None, float | None, float], Status],
    low: float | None,
    high: float | None,
    limit: float,
    expected: Status,
) -> None:
    assert judge(low, high, limit) is expected


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [
        (0.72, 0.78, MET),
        (0.70, 0.80, MET),
        (0.65, 0.75, WAIT),
        (0.75, 0.85, WAIT),
        (0.40, 0.69, MISSED),
        (0.81, 0.95, MISSED),
        (None, 0.75, WAIT),
        (None, 0.60, MISSED),
    ],
)
def test_the_gpu_band(low: float | None, high: float | None, expected: Status) -> None:
    assert within(low, high, (0.70, 0.80)) is expected


def backend(name: str, n: int, p50: float, p95: float, spread: float = 0.1) -> BackendSummary:
    b = BackendSummary(name, serve=n)
    b.ttft_n, b.ttft_p50_ms, b.ttft_p95_ms = n, p50, p95
    b.ttft_p50_low_ms, b.ttft_p50_high_ms = p50 * (1 - spread), p50 * (1 + spread)
    b.ttft_p95_low_ms, b.ttft_p95_high_ms = p95 * (1 - spread), p95 * (1 + spread)
    return b


@pytest.mark.parametrize(
    ("candidate", "status", "reason"),
    [
        (backend("vllm", 100, 300.0, 1500.0), MET, ""),
        (backend("vllm", 100, 300.0, 1900.0), WAIT, ""),  # [1710, 2090] straddles 2 s
        (backend("vllm", 100, 900.0, 2500.0), MISSED, ""),
        (backend("vllm", 10, 300.0, 1500.0), WAIT, "only 10 timed calls on the candidate; a verdict needs 20"),
        (BackendSummary("vllm", serve=5), NONE, "no streamed candidate answer in this window (TTFT needs a stream)"),
        (None, NONE, "no streamed candidate answer in this window (TTFT needs a stream)"),
    ],
)  # fmt: skip
def test_ttft_row(candidate: BackendSummary | None, status: Status, reason: str) -> None:
    row = ttft_row(backend("hosted", 100, 800.0, 2600.0), candidate)
    assert (row.status, row.reason, row.primary) == (status, reason, 2600.0)
    if candidate is not None and candidate.ttft_p95_ms is not None:
        assert (row.candidate, row.estimate) == (candidate.ttft_p95_ms, candidate.ttft_p95_ms)
        assert (row.low, row.high) == (candidate.ttft_p95_low_ms, candidate.ttft_p95_high_ms)


@pytest.mark.parametrize(
    ("candidate", "status", "estimate", "reason"),
    [
        (backend("vllm", 100, 200.0, 900.0, spread=0.05), MET, 0.75, ""),
        (backend("vllm", 100, 420.0, 900.0, spread=0.05), WAIT, 0.475, ""),
        (backend("vllm", 100, 700.0, 900.0, spread=0.05), MISSED, 0.125, ""),
        (backend("vllm", 5, 200.0, 900.0, spread=0.05), WAIT, 0.75, "only 5 timed calls on one arm; a verdict needs 20"),
        (BackendSummary("vllm"), NONE, None, "no streamed candidate answer in this window to compare"),
    ],
)  # fmt: skip
def test_ttft_improvement_row(
    candidate: BackendSummary, status: Status, estimate: float | None, reason: str
) -> None:
    row = improvement_row(backend("hosted", 100, 800.0, 2600.0, spread=0.05), candidate)
    assert (row.status, row.reason) == (status, reason)
    assert row.estimate == (None if estimate is None else pytest.approx(estimate))
    if estimate is not None:
        assert row.low is not None
        assert row.high is not None
        assert row.low < estimate < row.high


def decode(
    streams: int, p50: float, low: float | None, high: float | None, no_usage: int = 0
) -> DecodeSummary:
    return DecodeSummary("vllm", streams, no_usage, p50, low, high)


@pytest.mark.parametrize(
    ("candidate", "status", "reason"),
    [
        (decode(100, 80.0, 75.0, 85.0), MET, ""),
        (decode(100, 52.0, 48.0, 56.0), WAIT, ""),
        (decode(100, 30.0, 28.0, 33.0), MISSED, ""),
        (decode(10, 80.0, 75.0, 85.0), WAIT, "only 10 streams on the candidate; a verdict needs 20"),
        (DecodeSummary("vllm", 0, 7), NONE, "the candidate's 7 streams carried no usage to count tokens: clients must ask for stream_options.include_usage"),
        (None, NONE, "no candidate stream with decode timing in this window"),
    ],
)  # fmt: skip
def test_tps_row(candidate: DecodeSummary | None, status: Status, reason: str) -> None:
    row = tps_row(decode(100, 120.0, 110.0, 130.0), candidate)
    assert (row.status, row.reason, row.primary) == (status, reason, 120.0)


def flat(late_n: int, p95: float | None, low: float | None, high: float | None) -> Flatness:
    return Flatness("vllm", 200, 20, 12.5, -3.0, 28.0, 10, late_n, p95 and p95 / 2, p95, low, high)


@pytest.mark.parametrize(
    ("candidate", "status", "reason"),
    [
        (flat(40, 2000.0, 1800.0, 2400.0), MET, "TTFT slope +12.5 ms/turn [-3.0, +28.0]"),
        (flat(40, 2900.0, 2600.0, 3300.0), WAIT, "TTFT slope +12.5 ms/turn [-3.0, +28.0]"),
        (flat(40, 3500.0, 3100.0, 4000.0), MISSED, "TTFT slope +12.5 ms/turn [-3.0, +28.0]"),
        (flat(8, 2000.0, 1800.0, None), WAIT, "only 8 calls from turn 10 on the candidate; a verdict needs 20; TTFT slope +12.5 ms/turn [-3.0, +28.0]"),
        (flat(0, None, None, None), WAIT, "no candidate conversation reached turn 10; TTFT slope +12.5 ms/turn [-3.0, +28.0]"),
        (None, NONE, "no streamed candidate answer in this window"),
    ],
)  # fmt: skip
def test_flat_row(candidate: Flatness | None, status: Status, reason: str) -> None:
    row = flat_row(None, candidate)
    assert (row.status, row.reason) == (status, reason)


@pytest.mark.parametrize(
    ("gpu", "status", "reason"),
    [
        (GpuInput(0.75, 0.72, 0.78, 60, "dcgm"), MET, "60 samples"),
        (GpuInput(0.76, samples=1, source="dcgm"), MET, "1 samples"),  # a point, no interval
        (GpuInput(0.40, 0.35, 0.45, 60), MISSED, "60 samples"),
        (GpuInput(0.69, 0.60, 0.78, 60), WAIT, "60 samples"),
        (GpuInput(None, missing="the DCGM exporter answered 503"), NONE, "the DCGM exporter answered 503"),
        (None, NONE, "no GPU utilisation source given to this report (a DCGM exporter or Prometheus URL scraped over the window)"),
    ],
)  # fmt: skip
def test_gpu_row(gpu: GpuInput | None, status: Status, reason: str) -> None:
    row = gpu_row(gpu)
    assert (row.status, row.reason, row.primary) == (status, reason, None)


@pytest.mark.parametrize(
    ("cost", "status", "reason"),
    [
        (CostInput(5.0, 2.0, 1.5, 2.6, 10**7, 0.31), MET, "break-even at 31% GPU utilisation"),
        (CostInput(5.0, 4.5, 3.0, 6.0), WAIT, ""),
        (CostInput(5.0, 9.0, 7.0, 11.0), MISSED, ""),
        (CostInput(5.0, 9.0), MISSED, ""),  # a point, no interval
        (CostInput(5.0, None, missing="no --gpu-hour-price"), NONE, "no --gpu-hour-price"),
        (None, NONE, "no cost-per-token figures given to this report (GPU-hour price against the tokens the candidate served)"),
    ],
)  # fmt: skip
def test_cost_row(cost: CostInput | None, status: Status, reason: str) -> None:
    row = cost_row(cost)
    assert (row.status, row.reason) == (status, reason)


@pytest.mark.parametrize(
    ("users", "status", "reason"),
    [
        (UsersInput("score", 3.9, 4.2, 0.3, 0.1, 0.5, 200, 210), MET, ""),
        (UsersInput("score", 4.0, 4.05, 0.05, -0.1, 0.2, 200, 210), WAIT, ""),
        (UsersInput("score", 4.2, 3.8, -0.4, -0.6, -0.2, 200, 210), MISSED, ""),
        (UsersInput("score", 3.9, 4.2, 0.3, 0.1, 0.5, 8, 210), WAIT, "only 8 conversations on one arm; a verdict needs 20"),
        (UsersInput("abandonment", 0.2, 0.1, -0.1, -0.15, -0.05, 200, 210, higher_is_better=False), MET, ""),
        (UsersInput("abandonment", 0.1, 0.2, 0.1, 0.05, 0.15, 200, 210, higher_is_better=False), MISSED, ""),
        (UsersInput(missing="no feedback yet"), NONE, "no feedback yet"),
        (None, NONE, "no satisfaction or retention figures given to this report (feedback scores joined to the arm that served each conversation)"),
    ],
)  # fmt: skip
def test_users_row(users: UsersInput | None, status: Status, reason: str) -> None:
    row = users_row(users)
    assert (row.status, row.reason) == (status, reason)


def test_the_rows_come_in_the_playbooks_order_and_read_their_inputs() -> None:
    report = Report(0.0, 0.0, 1.0, "", "hosted", "vllm")
    inputs = ScorecardInputs(gpu=GpuInput(0.75, 0.72, 0.78, 60, "dcgm"))
    rows = scorecard(report, inputs)
    assert [r.key for r in rows] == [
        "ttft",
        "tps",
        "flat",
        "gpu",
        "cost",
        "ttft_improvement",
        "users",
    ]
    assert [r.status for r in rows] == [NONE, NONE, NONE, MET, NONE, NONE, NONE]
    assert (rows[3].candidate, rows[3].source) == (0.75, "dcgm")


def points(*per_conversation: tuple[float, ...]) -> list[tuple[str, float, float]]:
    """(conversation, turn, TTFT) for each conversation's TTFT at turns 1, 2, ..."""
    return [
        (f"c{i}", float(turn), ttft)
        for i, ttfts in enumerate(per_conversation)
        for turn, ttft in enumerate(ttfts, start=1)
    ]


@pytest.mark.parametrize(
    ("data", "estimate", "bounded", "excludes_zero"),
    [
        (points(*[(100.0, 200.0, 300.0)] * 6), 100.0, True, True),  # exact: zero width
        (points(*[(100.0 + i, 100.0 + i, 100.0 + i) for i in range(6)]), 0.0, True, False),
        (
            points((100.0, 300.0), (110.0, 310.0), (90.0, 290.0)),
            200.0,
            False,
            False,
        ),  # 3 conversations
        (points((100.0,), (200.0,), (300.0,)), None, False, False),  # one turn number
        (
            points(*[(500.0 - 10 * i, 450.0 - 10 * i, 400.0 - 10 * i) for i in range(8)]),
            -50.0,
            True,
            True,
        ),
    ],
)
def test_slope(
    data: list[tuple[str, float, float]], estimate: float | None, bounded: bool, excludes_zero: bool
) -> None:
    fit = slope(data)
    if estimate is None:
        assert fit is None
        return
    assert isinstance(fit, Slope)
    assert fit.estimate == pytest.approx(estimate)
    assert (fit.interval is not None) is bounded
    if fit.interval is not None:
        assert fit.interval.low <= fit.estimate <= fit.interval.high
        assert (fit.interval.low > 0 or fit.interval.high < 0) is excludes_zero


def test_the_slopes_interval_widens_when_conversations_disagree() -> None:
    """Conversations that each climb at a different rate: the slope is their mean, and
    the cluster-robust interval is as wide as their spread says."""
    rates = (0.0, 20.0, 40.0, 60.0, 80.0, 100.0)
    fit = slope(points(*[tuple(100.0 + r * t for t in range(5)) for r in rates]))
    assert fit is not None
    assert fit.interval is not None
    assert fit.estimate == pytest.approx(50.0)
    assert 10.0 < fit.estimate - fit.interval.low < 50.0
