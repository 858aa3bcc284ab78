"""Online parity: scores arrive one pair at a time from the proxy's background thread, and
gates and the report read the noise-adjusted figure whenever they like.

`ParityAggregator` keeps candidate-vs-primary and primary-vs-primary verdicts, over all
time or over a sliding window, and turns them into a `ParityReport` on demand. It stores
only which comparators applied and disagreed per pair, not the answers. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kvmigrate.parity.noise import CONCLUSIVE, NoiseSettings, ParityReport, Tally, calibrate
from kvmigrate.parity.result import PairScore

CANDIDATE = "candidate"
NOISE = "noise"


@dataclass(frozen=True, slots=True)
class _Entry:
    at: float
    kind: str
    applicable: frozenset[str]
    disagree: frozenset[str]


class ParityAggregator:
    """window_seconds: only pairs added in the last this-many seconds count (None: all).
    max_entries: the most pairs a window keeps; the oldest go first. clock: for tests."""

    def __init__(
        self,
        settings: NoiseSettings | None = None,
        *,
        window_seconds: float | None = None,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or NoiseSettings()
        self._window = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque(maxlen=max_entries)
        self._totals = {CANDIDATE: Tally(), NOISE: Tally()}

    def add_candidate(self, score: PairScore) -> None:
        """A candidate answer scored against the primary answer it shadowed."""
        if score.scorable:
            self.add_flags(CANDIDATE, score.applicable, score.disagreements)

    def add_noise(self, score: PairScore) -> None:
        """A second primary answer scored against the first (the noise floor)."""
        if score.scorable:
            self.add_flags(NOISE, score.applicable, score.disagreements)

    def add_flags(self, kind: str, applicable: Iterable[str], disagree: Iterable[str]) -> None:
        """The same from stored flags (e.g. records read back from the database)."""
        if kind not in (CANDIDATE, NOISE):
            raise ValueError(f"kind must be {CANDIDATE!r} or {NOISE!r}, not {kind!r}")
        entry = _Entry(self._clock(), kind, frozenset(applicable), frozenset(disagree))
        with self._lock:
            if self._window is None:
                self._totals[kind].add(entry.applicable, entry.disagree)
            else:
                self._entries.append(entry)

    def reset(self) -> None:
        """Forget everything: after a rollout change, old evidence describes another setup."""
        with self._lock:
            self._entries.clear()
            self._totals = {CANDIDATE: Tally(), NOISE: Tally()}

    def report(self) -> ParityReport:
        with self._lock:
            if self._window is None:
                candidate = _copy(self._totals[CANDIDATE])
                noise = _copy(self._totals[NOISE])
            else:
                candidate, noise = self._window_tallies()
        return calibrate(candidate, noise, self.settings)

    def window_figures(self) -> tuple[float | None, int]:
        """(parity, samples) for `BackendWindow.parity` / `parity_samples`: parity is None
        unless the report is conclusive, so a gate reads Inconclusive rather than a guess."""
        report = self.report()
        parity = report.parity if report.status == CONCLUSIVE else None
        return parity, report.candidate_pairs

    def _window_tallies(self) -> tuple[Tally, Tally]:
        assert self._window is not None
        horizon = self._clock() - self._window
        while self._entries and self._entries[0].at < horizon:
            self._entries.popleft()
        tallies = {CANDIDATE: Tally(), NOISE: Tally()}
        for entry in self._entries:
            tallies[entry.kind].add(entry.applicable, entry.disagree)
        return tallies[CANDIDATE], tallies[NOISE]


def _copy(source: Tally) -> Tally:
    return Tally(source.pairs, source.agreed, source.applicable.copy(), source.disagree.copy())
