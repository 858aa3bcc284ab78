"""What the parity gate reports in each state, exactly: pairs short, the noise floor short,
no comparator covered, passed with one still waiting, failed, inconclusive. The detail line is
what an operator reads; the figures and interval what `kvmigrate rollout status` prints."""

from __future__ import annotations

from typing import Any

import pytest
from gate_rows import rounded

from kvmigrate.policies.gates import GateConfig
from kvmigrate.policies.parity_gate import parity_gate
from kvmigrate.policies.window import BackendWindow as W
from kvmigrate.policies.window import ComparatorCounts as C

PARITY = GateConfig(min_parity=0.9, min_parity_samples=30)
PARITY_ROWS: list[tuple[str, W, dict[str, Any]]] = [
    (
        "too few pairs, noise short too",
        W(
            "c",
            parity_samples=12,
            noise_pairs=3,
            noise_needed=20,
            span_s=600,
            comparators=(C("exact", 12, 1, 3, 0),),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "need 30 scored pairs (rollout.gates.min_parity_samples); have 12; at the current rate (10 min so far) about 15 min more; and 3 of the 20 noise pairs",
            "estimate": None,
            "interval": [None, None],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 12,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 3,
                "noise_needed": 20,
                "not_yet_covered": ["exact"],
            },
        },
    ),
    (
        "too few pairs, noise enough",
        W(
            "c",
            parity_samples=12,
            noise_pairs=20,
            noise_needed=20,
            comparators=(C("exact", 12, 1, 20, 0),),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "need 30 scored pairs (rollout.gates.min_parity_samples); have 12",
            "estimate": None,
            "interval": [None, None],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 12,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 20,
                "noise_needed": 20,
                "not_yet_covered": ["exact"],
            },
        },
    ),
    (
        "noise short",
        W(
            "c",
            parity_samples=40,
            noise_pairs=5,
            noise_needed=20,
            span_s=300,
            comparators=(C("exact", 40, 1, 5, 0),),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "40 scored pairs are in, but the noise floor needs 20 primary-vs-primary pairs; have 5; at the current rate (5 min so far) about 15 min more. Raise rollout.noise_sample (share of conversations sent to the primary twice) or rollout.noise_per_minute",
            "estimate": None,
            "interval": [None, None],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 40,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 5,
                "noise_needed": 20,
                "not_yet_covered": ["exact"],
            },
        },
    ),
    (
        "no comparator covered",
        W(
            "c",
            parity_samples=40,
            noise_pairs=20,
            noise_needed=20,
            comparators=(
                C("exact", 40, 1, 10, 0),
                C("judge", 1, 0, 20, 0),
                C("unused", 0, 0, 0, 0),
            ),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "40 scored pairs are in, but no comparator has both 30 scored pairs (rollout.gates.min_parity_samples) and its noise pairs yet; not yet covered: exact (40/30 pairs, 10/20 noise), judge (1/30 pairs, 20/20 noise)",
            "estimate": None,
            "interval": [None, None],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 40,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 20,
                "noise_needed": 20,
                "not_yet_covered": ["exact", "judge"],
            },
        },
    ),
    (
        "passed, one waiting",
        W(
            "c",
            parity=0.99,
            parity_samples=400,
            noise_pairs=200,
            noise_needed=20,
            conversations=80,
            comparators=(
                C("unused", 0, 0, 0, 0),
                C("exact", 400, 4, 200, 2),
                C("judge", 12, 0, 200, 0),
            ),
        ),
        {
            "name": "parity",
            "verdict": "passed",
            "detail": "noise-adjusted parity since the last change, lowest of 1 comparator with 30+ pairs: exact 1.000 [0.965, 1.000] vs 0.9 (rollout.gates.min_parity); not yet covered: judge (12/30 pairs, 200/20 noise)",
            "estimate": 1.0,
            "interval": [0.9654850004150907, 1.0],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": 0.99,
                "samples": 400,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 200,
                "noise_needed": 20,
                "not_yet_covered": ["judge"],
                "comparators": [
                    {
                        "name": "exact",
                        "verdict": "passed",
                        "parity": 1.0,
                        "low": 0.9654850004150907,
                        "high": 1.0,
                    }
                ],
            },
        },
    ),
    (
        "failed",
        W(
            "c",
            parity_samples=400,
            noise_pairs=300,
            noise_needed=20,
            conversations=80,
            comparators=(C("exact", 400, 120, 300, 3), C("embed", 400, 8, 300, 3)),
        ),
        {
            "name": "parity",
            "verdict": "failed",
            "detail": "noise-adjusted parity since the last change, lowest of 2 comparators with 30+ pairs: exact 0.710 [0.630, 0.791] vs 0.9 (rollout.gates.min_parity)",
            "estimate": 0.71,
            "interval": [0.6299817433712058, 0.7905136246161212],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 400,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 300,
                "noise_needed": 20,
                "not_yet_covered": [],
                "comparators": [
                    {
                        "name": "exact",
                        "verdict": "failed",
                        "parity": 0.71,
                        "low": 0.6299817433712058,
                        "high": 0.7905136246161212,
                    },
                    {
                        "name": "embed",
                        "verdict": "passed",
                        "parity": 0.99,
                        "low": 0.950657515809195,
                        "high": 1.0,
                    },
                ],
            },
        },
    ),
    (
        "inconclusive",
        W(
            "c",
            parity_samples=60,
            noise_pairs=25,
            noise_needed=20,
            conversations=30,
            span_s=1200,
            comparators=(C("exact", 60, 4, 25, 1),),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "noise-adjusted parity since the last change, lowest of 1 comparator with 30+ pairs: exact 0.973 [0.802, 1.000] vs 0.9 (rollout.gates.min_parity); about 106 more conversations at the observed rates; at the current rate (20 min so far) about 71 min more",
            "estimate": 0.9733,
            "interval": [0.8020890955841534, 1.0],
            "threshold": 0.9,
            "needed_conversations": 106,
            "figures": {
                "parity": None,
                "samples": 60,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 25,
                "noise_needed": 20,
                "not_yet_covered": [],
                "comparators": [
                    {
                        "name": "exact",
                        "verdict": "inconclusive",
                        "parity": 0.9733,
                        "low": 0.8020890955841534,
                        "high": 1.0,
                    }
                ],
            },
        },
    ),
    (
        "one noise pair is enough when none is needed",
        W(
            "c",
            parity_samples=200,
            noise_pairs=1,
            noise_needed=0,
            conversations=50,
            comparators=(C("exact", 200, 2, 1, 0),),
        ),
        {
            "name": "parity",
            "verdict": "passed",
            "detail": "noise-adjusted parity since the last change, lowest of 1 comparator with 30+ pairs: exact 0.990 [0.934, 1.000] vs 0.9 (rollout.gates.min_parity)",
            "estimate": 0.99,
            "interval": [0.9340327408944229, 1.0],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 200,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 1,
                "noise_needed": 0,
                "not_yet_covered": [],
                "comparators": [
                    {
                        "name": "exact",
                        "verdict": "passed",
                        "parity": 0.99,
                        "low": 0.9340327408944229,
                        "high": 1.0,
                    }
                ],
            },
        },
    ),
    (
        "exactly the pairs needed, no comparator covered",
        W(
            "c",
            parity_samples=30,
            noise_pairs=20,
            noise_needed=20,
            comparators=(C("exact", 30, 1, 10, 0),),
        ),
        {
            "name": "parity",
            "verdict": "inconclusive",
            "detail": "30 scored pairs are in, but no comparator has both 30 scored pairs (rollout.gates.min_parity_samples) and its noise pairs yet; not yet covered: exact (30/30 pairs, 10/20 noise)",
            "estimate": None,
            "interval": [None, None],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 30,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 20,
                "noise_needed": 20,
                "not_yet_covered": ["exact"],
            },
        },
    ),
    (
        "passed, two waiting",
        W(
            "c",
            parity_samples=400,
            noise_pairs=200,
            noise_needed=20,
            conversations=80,
            comparators=(
                C("exact", 400, 4, 200, 2),
                C("judge", 12, 0, 200, 0),
                C("embed", 20, 0, 200, 0),
            ),
        ),
        {
            "name": "parity",
            "verdict": "passed",
            "detail": "noise-adjusted parity since the last change, lowest of 1 comparator with 30+ pairs: exact 1.000 [0.965, 1.000] vs 0.9 (rollout.gates.min_parity); not yet covered: judge (12/30 pairs, 200/20 noise), embed (20/30 pairs, 200/20 noise)",
            "estimate": 1.0,
            "interval": [0.9654850004150907, 1.0],
            "threshold": 0.9,
            "needed_conversations": None,
            "figures": {
                "parity": None,
                "samples": 400,
                "min_parity": 0.9,
                "min_parity_samples": 30,
                "noise_pairs": 200,
                "noise_needed": 20,
                "not_yet_covered": ["judge", "embed"],
                "comparators": [
                    {
                        "name": "exact",
                        "verdict": "passed",
                        "parity": 1.0,
                        "low": 0.9654850004150907,
                        "high": 1.0,
                    }
                ],
            },
        },
    ),
]


@pytest.mark.parametrize(
    ("candidate", "expected"), [r[1:] for r in PARITY_ROWS], ids=[r[0] for r in PARITY_ROWS]
)
def test_the_parity_gate_reports_each_comparator_and_what_it_still_needs(
    candidate: W, expected: dict[str, Any]
) -> None:
    assert rounded(parity_gate(candidate, PARITY).to_dict()) == rounded(expected)


def test_a_comparator_with_a_lower_bound_than_the_lowest_estimate_is_named_with_it() -> None:
    """Two comparators at 1.000, one on fewer pairs: the line names the one whose interval
    sets the headline bound, never one comparator beside another's interval."""
    candidate = W(
        "c",
        parity=1.0,
        parity_samples=400,
        noise_pairs=200,
        noise_needed=20,
        conversations=80,
        comparators=(C("api_shape", 400, 0, 200, 0), C("text", 40, 0, 40, 0)),
    )
    gate = parity_gate(candidate, PARITY)
    assert gate.detail.partition("; about")[0] == (
        "noise-adjusted parity since the last change, lowest of 2 comparators with 30+ pairs: "
        f"api_shape 1.000 [{gate.figures['comparators'][0]['low']:.3f}, 1.000]; lowest bound "
        f"text 1.000 [{gate.low:.3f}, 1.000] vs 0.9 (rollout.gates.min_parity)"
    )
    assert gate.low == gate.figures["comparators"][1]["low"] < 0.96
