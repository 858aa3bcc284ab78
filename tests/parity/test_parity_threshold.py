"""`parity --min-score` decides from the interval: a table of the pure decision, then the
labelled set run many times: a noise-only candidate is never failed, and a candidate twenty
points worse is never passed."""

from __future__ import annotations

import random

import pytest
from parity_support import HOSTED_MODEL, emulator

from kvmigrate.parity.compare import compare
from kvmigrate.parity.labelled import (
    LabelledPair,
    Post,
    build_labelled_set,
    divergent_pair,
    http_poster,
    noise_pair,
    text_request,
)
from kvmigrate.parity.noise import NoiseSettings, Tally, calibrate
from kvmigrate.parity.threshold import decide
from kvmigrate.policies.sequential import Verdict

RUNS = 20
CANDIDATE_PAIRS = 30
NOISE_PAIRS = 60  # the CLI's --repeats 2
NOISE = 0.3  # the emulator's noise knob, as in the quality bar


def _tally(pairs: list[LabelledPair]) -> Tally:
    tally = Tally()
    for pair in pairs:
        tally.add_score(compare(pair.request, pair.primary, pair.candidate))
    return tally


def _counts_report(k1: int, n1: int, k2: int, n2: int) -> tuple[Tally, Tally]:
    candidate, noise = Tally(), Tally()
    for i in range(n1):
        candidate.add({"text"}, {"text"} if i < k1 else set())
    for i in range(n2):
        noise.add({"text"}, {"text"} if i < k2 else set())
    return candidate, noise


@pytest.mark.parametrize(
    ("k1", "n1", "k2", "n2", "expected", "more"),
    [
        (0, 200, 0, 200, Verdict.PASSED, None),  # lower bound 0.98 >= 0.9
        (60, 200, 0, 200, Verdict.FAILED, None),  # excess 0.3, its interval well above 0.1
        (3, 24, 2, 48, Verdict.INCONCLUSIVE, True),  # the 0.875-ish case straddles
        (20, 200, 0, 200, Verdict.INCONCLUSIVE, False),  # parity 0.9 exactly: never decides
    ],
)
def test_the_decision_reads_the_interval(
    k1: int, n1: int, k2: int, n2: int, expected: Verdict, more: bool | None
) -> None:
    candidate, noise = _counts_report(k1, n1, k2, n2)
    report = calibrate(candidate, noise, NoiseSettings(min_noise_samples=10))
    decision = decide(report, 0.9, n1)
    assert decision is not None
    assert decision.verdict is expected
    low, high = decision.deciding.interval.low, decision.deciding.interval.high
    if expected is Verdict.PASSED:
        assert low >= 0.9
    if expected is Verdict.FAILED:
        assert high < 0.9
    if expected is Verdict.INCONCLUSIVE:
        assert low < 0.9 <= high
        assert (decision.more_requests is not None) is more
        if more:
            assert (decision.more_requests or 0) > 0
    else:
        assert decision.more_requests is None


def test_no_conclusive_comparator_means_no_decision() -> None:
    candidate, noise = _counts_report(0, 30, 0, 5)
    report = calibrate(candidate, noise, NoiseSettings(min_noise_samples=10))
    assert decide(report, 0.9, 30) is None


def _noise_run(post: Post, seed: int) -> tuple[Tally, Tally]:
    pairs = build_labelled_set(post, HOSTED_MODEL, per_class=0,
                               noise_pairs=CANDIDATE_PAIRS + NOISE_PAIRS, seed=seed)  # fmt: skip
    return _tally(pairs[:CANDIDATE_PAIRS]), _tally(pairs[CANDIDATE_PAIRS:])


def _worse_run(post: Post, seed: int) -> tuple[Tally, Tally]:
    """Text requests; one candidate answer in five is on another topic: parity 0.8."""
    rng = random.Random(seed)
    candidate = [
        divergent_pair(post, "different_topic", text_request(HOSTED_MODEL, rng), rng)
        if i % 5 == 0
        else noise_pair(post, text_request(HOSTED_MODEL, rng), rng)
        for i in range(CANDIDATE_PAIRS)
    ]
    noise = [noise_pair(post, text_request(HOSTED_MODEL, rng), rng) for _ in range(NOISE_PAIRS)]
    return _tally(candidate), _tally(noise)


def test_a_noise_only_candidate_is_never_failed_and_a_worse_one_never_passed() -> None:
    noise_verdicts: list[Verdict] = []
    worse_verdicts: list[Verdict] = []
    with emulator("hosted", noise=NOISE) as server:
        post = http_poster(server.url + "/v1")
        for seed in range(RUNS):
            for run, verdicts in ((_noise_run, noise_verdicts), (_worse_run, worse_verdicts)):
                candidate, noise = run(post, seed)
                report = calibrate(candidate, noise)
                decision = decide(report, 0.9, CANDIDATE_PAIRS)
                assert decision is not None, report.reason
                verdicts.append(decision.verdict)
    print(f"\nnoise-only: {sorted(noise_verdicts)}\n20 points worse: {sorted(worse_verdicts)}")
    assert Verdict.FAILED not in noise_verdicts
    assert Verdict.PASSED not in worse_verdicts
    # Thirty requests cannot show a noise-only candidate reaches 0.9 (inconclusive, not a
    # pass), but they do show one twenty points worse is below it.
    assert Verdict.FAILED in worse_verdicts
