"""Cost per token by arm, GPU-hours and the break-even utilisation: tables of windows and
the figures each must give."""

from __future__ import annotations

import pytest

from kvmigrate.report.cost_per_token import (
    GpuCount,
    arm_cost,
    cost_per_token,
    gpu_count,
    hours_running,
)
from kvmigrate.report.model import Prices
from kvmigrate.report.rows import Row

# $1 per 1M input, $0.5 cached, $4 output; $2 per GPU-hour.
PRICES = Prices(input_per_m=1.0, cached_input_per_m=0.5, output_per_m=4.0, gpu_per_hour=2.0)


def row(
    ts: float,
    backend: str,
    prompt: int,
    output: int,
    cached: int = 0,
    status: int | None = 200,
    role: str = "serve",
) -> Row:
    return Row(
        f"r{ts}{backend}", ts, backend, role, "c", 1, status, None, 10.0, 1000.0,
        prompt, cached, output, None, None, None, None, None, None, None,
    )  # fmt: skip


def test_each_arm_is_priced_on_the_tokens_it_answered() -> None:
    rows = [
        row(0, "hosted", 1_000_000, 250_000, cached=400_000),
        row(1, "vllm", 2_000_000, 500_000, role="shadow"),
        row(2, "vllm", 9_000_000, 9_000_000, status=500),  # failed: not answered
        row(3, "hosted", 5, 5, status=None),  # never answered
    ]
    hosted = arm_cost(rows, "hosted", "primary", PRICES)
    # 0.6M x $1 + 0.4M x $0.5 + 0.25M x $4 = $1.8 over 1.25M tokens
    assert (hosted.requests, hosted.input_tokens, hosted.output_tokens) == (1, 1_000_000, 250_000)
    assert hosted.cached_tokens == 400_000
    assert hosted.hosted_usd == pytest.approx(1.8)
    assert hosted.hosted_usd_per_m == pytest.approx(1.44)
    vllm = arm_cost(rows, "vllm", "candidate", PRICES)
    assert vllm.requests == 1
    assert vllm.hosted_usd == pytest.approx(4.0)  # 2M x $1 + 0.5M x $4
    assert vllm.hosted_usd_per_m == pytest.approx(1.6)
    assert arm_cost([], "vllm", "candidate", PRICES).hosted_usd is None


@pytest.mark.parametrize(
    ("configured", "seen", "answering", "per_replica", "replicas", "expected"),
    [
        (8, 4, 2, 1, 2, GpuCount(8, "config (gpu.gpus)")),
        (0, 4, 2, 1, 2, GpuCount(4, "the GPU source's count")),
        (0, None, 2, 4, 3, GpuCount(8, "2 scraped replicas x 4")),
        (0, None, 0, 2, 3, GpuCount(6, "3 configured replicas x 2")),
        (0, None, 1, 1, 3, GpuCount(1, "1 scraped replica x 1")),
        (0, None, 0, 1, 0, GpuCount(None, "no replica of the candidate is configured")),
    ],
)
def test_gpu_count(
    configured: int,
    seen: int | None,
    answering: int,
    per_replica: int,
    replicas: int,
    expected: GpuCount,
) -> None:
    assert gpu_count(configured, seen, answering, per_replica, replicas) == expected


@pytest.mark.parametrize(
    ("span", "rows", "expected"),
    [
        (7200.0, [], (2.0, "between the first and last scrape")),
        (None, [row(0, "vllm", 1, 1), row(3599, "vllm", 1, 1)],
         (1.0, "between the candidate's first and last answer")),
        (None, [], (None, "no answer from the candidate in this window")),
    ],
)  # fmt: skip
def test_hours_running(
    span: float | None, rows: list[Row], expected: tuple[float | None, str]
) -> None:
    assert hours_running(span, rows) == expected


# The candidate answered 2.5M tokens worth $4 at hosted prices, on 1 GPU for 1 hour: $2.
WINDOW = [row(0, "hosted", 1_000_000, 250_000), row(1, "vllm", 2_000_000, 500_000)]


@pytest.mark.parametrize(
    ("gpus", "utilisation", "load", "break_even_pct", "per_m"),
    [
        (1, 60.0, 0.5, 30.0, 0.8),  # half the hosted price: break-even at half the load
        (4, 60.0, 2.0, 120.0, 3.2),  # four GPUs: twice the load, past full utilisation
        (1, None, 0.5, None, 0.8),  # no utilisation measured: no break-even utilisation
    ],
)
def test_break_even(
    gpus: int, utilisation: float | None, load: float, break_even_pct: float | None, per_m: float
) -> None:
    figures = cost_per_token(
        WINDOW, "hosted", "vllm", PRICES, GpuCount(gpus, "given"), (1.0, "given"), utilisation
    )
    primary, candidate = figures.arms
    assert primary.self_hosted_usd is None
    assert candidate.self_hosted_usd == pytest.approx(2.0 * gpus)
    assert candidate.self_hosted_usd_per_m == pytest.approx(per_m)
    assert figures.gpu_hours == gpus
    assert figures.break_even_load == pytest.approx(load)
    if break_even_pct is None:
        assert figures.break_even_utilisation_pct is None
    else:
        assert figures.break_even_utilisation_pct == pytest.approx(break_even_pct)
    # 2.5M tokens in an hour on `gpus` GPUs, times the load multiple
    assert figures.break_even_tokens_per_gpu_s == pytest.approx(2.5e6 / 3600 / gpus * load)
    assert figures.reason == ""


@pytest.mark.parametrize(
    ("rows", "gpus", "hours", "reason"),
    [
        (WINDOW, GpuCount(None, "no replica of the candidate is configured"), (1.0, "x"),
         "no replica of the candidate is configured"),
        (WINDOW, GpuCount(1, "x"), (None, "no answer from the candidate in this window"),
         "no answer from the candidate in this window"),
        (WINDOW[:1], GpuCount(1, "x"), (1.0, "x"),
         "the candidate answered no tokens in this window"),
    ],
)  # fmt: skip
def test_why_the_self_hosted_side_is_missing(
    rows: list[Row], gpus: GpuCount, hours: tuple[float | None, str], reason: str
) -> None:
    figures = cost_per_token(rows, "hosted", "vllm", PRICES, gpus, hours, 70.0)
    assert figures.reason == reason
    assert figures.arms[1].self_hosted_usd is None
    assert figures.break_even_utilisation_pct is None
    assert figures.arms[0].hosted_usd == pytest.approx(2.0)  # the primary's is still priced
