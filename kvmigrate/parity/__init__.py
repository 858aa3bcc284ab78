"""The parity engine: does the candidate answer like the primary, beyond sampling noise?

- `compare(request, primary, candidate)` / `score_exchange_pair(...)`: one pair, every
  comparator (text, topic, tool calls, structured output, finish reason, refusal, length,
  API shape, and semantic similarity with the `[semantic]` extra).
- `ParityAggregator`: pairs as they come, candidate-vs-primary and primary-vs-primary,
  into the noise-adjusted figure that gates and the report use.
- `calibrate(...)`: the same from tallies; `run_replay(...)`: `kvmigrate parity`'s offline
  replay of a request dataset against both backends.
"""

from kvmigrate.parity.aggregate import ParityAggregator
from kvmigrate.parity.answer import Answer, Outcome, extract_answer, read_outcome
from kvmigrate.parity.compare import COMPARATORS, compare, score_exchange_pair
from kvmigrate.parity.noise import (
    CONCLUSIVE,
    INCONCLUSIVE,
    NO_DATA,
    ComparatorParity,
    NoiseSettings,
    ParityReport,
    Tally,
    calibrate,
    tally,
)
from kvmigrate.parity.result import COMPARATOR_NAMES, ComparatorResult, PairScore
from kvmigrate.parity.semantic import SemanticScorer, load_semantic, semantic_available
from kvmigrate.parity.settings import ParitySettings

__all__ = [
    "COMPARATORS",
    "COMPARATOR_NAMES",
    "CONCLUSIVE",
    "INCONCLUSIVE",
    "NO_DATA",
    "Answer",
    "ComparatorParity",
    "ComparatorResult",
    "NoiseSettings",
    "Outcome",
    "PairScore",
    "ParityAggregator",
    "ParityReport",
    "ParitySettings",
    "SemanticScorer",
    "Tally",
    "calibrate",
    "compare",
    "extract_answer",
    "load_semantic",
    "read_outcome",
    "score_exchange_pair",
    "semantic_available",
    "tally",
]
