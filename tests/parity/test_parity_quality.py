"""The quality bar: on a labelled set built with the emulator's noise knob, at least 95% of
injected divergences are flagged and at most 5% of noise-only pairs raise a false alarm.

Run with `-s` to see the figures; benchmarks/parity_quality.py prints the same."""

from __future__ import annotations

import pytest
from parity_support import HOSTED_MODEL, VLLM_MODEL, emulator

from kvmigrate.parity.labelled import DIVERGENCES, build_labelled_set, http_poster, measure_quality

PER_CLASS = 40
NOISE_PAIRS = 240
# Twice the emulator's default noise: noise pairs differ by a reworded sentence or more.
NOISE = 0.3


@pytest.mark.parametrize(("profile", "model"), [("hosted", HOSTED_MODEL), ("vllm", VLLM_MODEL)])
def test_detection_and_false_alarms(profile: str, model: str) -> None:
    with emulator(profile, noise=NOISE) as server:
        pairs = build_labelled_set(
            http_poster(server.url + "/v1"), model, per_class=PER_CLASS, noise_pairs=NOISE_PAIRS
        )
    figures = measure_quality(pairs)
    assert all(figures.counts[label] >= 30 for label in DIVERGENCES)
    print(
        f"\nparity quality ({profile}, noise {NOISE}): divergences flagged "
        f"{figures.detection_rate:.1%} of {sum(figures.counts[d] for d in DIVERGENCES)}, "
        f"false alarms {figures.false_alarm_rate:.1%} of {figures.counts['noise']} noise pairs"
    )
    for label, rate in figures.detection.items():
        print(f"  {label:<16} {rate:.1%}")
    assert figures.detection_rate >= 0.95, figures.misses[:5]
    assert all(rate >= 0.85 for rate in figures.detection.values()), figures.detection
    assert figures.false_alarm_rate <= 0.05, figures.false_alarms[:5]


def test_noise_pairs_really_differ() -> None:
    """The set would prove nothing if noise pairs were identical."""
    with emulator("hosted", noise=NOISE) as server:
        pairs = build_labelled_set(http_poster(server.url + "/v1"), HOSTED_MODEL,
                                   per_class=0, noise_pairs=40)  # fmt: skip
    texts = [(p.primary.response, p.candidate.response) for p in pairs]
    assert sum(a != b for a, b in texts) >= 20
