"""Noise calibration: intervals, the excess over the noise floor, Inconclusive, and the
online aggregator."""

from __future__ import annotations

import threading

import pytest

from kvmigrate.intervals import newcombe_difference, wilson, z_for
from kvmigrate.parity import (
    CONCLUSIVE,
    INCONCLUSIVE,
    NO_DATA,
    ComparatorResult,
    NoiseSettings,
    PairScore,
    ParityAggregator,
    Tally,
    calibrate,
)
from kvmigrate.parity.noise import NOT_APPLICABLE


def test_wilson_matches_published_values() -> None:
    # Newcombe (1998), table I: 81/263 -> 0.2553 to 0.3662 at 95%.
    interval = wilson(81, 263, z_for(0.95))
    assert interval.low == pytest.approx(0.2553, abs=1e-4)
    assert interval.high == pytest.approx(0.3662, abs=1e-4)
    edge = wilson(0, 10, z_for(0.95))
    assert edge.low == 0.0
    assert 0.25 < edge.high < 0.35


def test_newcombe_difference_matches_published_values() -> None:
    # Newcombe (1998), table II example (a): 56/70 - 48/80 -> 0.0524 to 0.3339 (method 10).
    difference, interval = newcombe_difference(56, 70, 48, 80, z_for(0.95))
    assert difference == pytest.approx(0.2)
    assert interval.low == pytest.approx(0.0524, abs=1e-4)
    assert interval.high == pytest.approx(0.3339, abs=1e-4)


def tally(
    pairs: int, disagree: dict[str, int], names: tuple[str, ...] = ("text", "tool_calls")
) -> Tally:
    result = Tally()
    for index in range(pairs):
        result.add(names, [n for n, k in disagree.items() if index < k])
    return result


def test_a_candidate_as_noisy_as_the_primary_has_full_parity() -> None:
    report = calibrate(tally(100, {"text": 30}), tally(100, {"text": 35}))
    assert report.status == CONCLUSIVE
    assert report.parity == 1.0
    text = report.get("text")
    assert text is not None
    assert text.excess == pytest.approx(-0.05)
    assert text.parity == 1.0


def test_parity_is_one_minus_the_excess_of_the_worst_comparator() -> None:
    report = calibrate(tally(100, {"text": 40, "tool_calls": 25}), tally(100, {"text": 30}))
    assert report.status == CONCLUSIVE
    assert report.parity == pytest.approx(0.75)
    assert "tool_calls" in report.reason
    tools = report.get("tool_calls")
    assert tools is not None
    assert tools.parity_low is not None
    assert tools.parity_high is not None
    assert tools.parity_low < 0.75 < tools.parity_high
    assert report.raw_agreement == pytest.approx(0.6)


def test_too_few_noise_samples_is_inconclusive() -> None:
    report = calibrate(tally(100, {"text": 50}), tally(5, {}), NoiseSettings(min_noise_samples=20))
    assert report.status == INCONCLUSIVE
    assert report.parity is None
    assert "too few noise samples" in report.reason
    assert report.to_dict()["parity"] is None


def test_comparators_without_candidate_samples_do_not_apply() -> None:
    candidate = tally(40, {}, names=("text",))
    noise = tally(40, {}, names=("text", "tool_calls"))
    report = calibrate(candidate, noise)
    tools = report.get("tool_calls")
    assert tools is not None
    assert tools.status == NOT_APPLICABLE
    assert report.status == CONCLUSIVE


def test_no_pairs_at_all() -> None:
    assert calibrate(Tally(), Tally()).status == NO_DATA


def _score(*disagreeing: str) -> PairScore:
    names = ("text", "refusal")
    return PairScore(
        tuple(
            ComparatorResult(n, n not in disagreeing, 0.0 if n in disagreeing else 1.0)
            for n in names
        )
    )


def test_aggregator_feeds_the_gate_figures() -> None:
    aggregator = ParityAggregator(NoiseSettings(min_noise_samples=10))
    for _ in range(9):
        aggregator.add_noise(_score())
    for index in range(40):
        aggregator.add_candidate(_score("refusal") if index < 10 else _score())
    assert aggregator.window_figures() == (None, 40)  # 9 noise samples: inconclusive
    aggregator.add_noise(_score())
    parity, samples = aggregator.window_figures()
    assert samples == 40
    assert parity == pytest.approx(0.75)
    aggregator.reset()
    assert aggregator.window_figures() == (None, 0)


def test_aggregator_window_forgets_old_pairs() -> None:
    now = [1000.0]
    aggregator = ParityAggregator(
        NoiseSettings(min_noise_samples=1), window_seconds=60, clock=lambda: now[0]
    )
    aggregator.add_candidate(_score("text"))
    aggregator.add_noise(_score())
    now[0] += 30
    aggregator.add_candidate(_score())
    assert aggregator.report().candidate_pairs == 2
    now[0] += 45
    report = aggregator.report()
    assert report.candidate_pairs == 1
    assert report.noise_pairs == 0


def test_aggregator_ignores_unscorable_pairs_and_is_thread_safe() -> None:
    aggregator = ParityAggregator()
    aggregator.add_candidate(PairScore((), "primary_error"))

    def add() -> None:
        for _ in range(500):
            aggregator.add_candidate(_score())
            aggregator.add_noise(_score())

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report = aggregator.report()
    assert report.candidate_pairs == 2000
    assert report.noise_pairs == 2000
    with pytest.raises(ValueError, match="kind"):
        aggregator.add_flags("shadow", [], [])
