"""What an engine's running totals say about a window, as Prometheus's `increase()` and
`histogram_quantile()` read them: pure functions over samples in time order."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence

from kvmigrate.engine.vllm_sample import Histogram


def increase(values: Sequence[float | None]) -> float | None:
    """How much a counter grew over its samples (in time order). A value below the one
    before is a restart: the counter began again from zero, so all of it is new. None
    with fewer than two samples, which cannot tell growth."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if len(known) < 2:
        return None
    grown = 0.0
    for before, after in itertools.pairwise(known):
        grown += after - before if after >= before else after
    return grown


def histogram_increase(samples: Sequence[Histogram | None]) -> Histogram | None:
    """A histogram's observations over its samples (in time order), bucket by bucket; a
    sample with fewer observations than the one before is a restart. Buckets are those of
    the last sample (vLLM's do not change while it runs)."""
    known = [h for h in samples if h is not None]
    if len(known) < 2:
        return None
    bounds = [b for b, _ in known[-1].buckets]
    grown = dict.fromkeys(bounds, 0.0)
    total = count = 0.0
    for before, after in itertools.pairwise(known):
        restarted = after.count < before.count
        previous = {} if restarted else dict(before.buckets)
        for bound, value in after.buckets:
            if bound in grown:
                grown[bound] += value - previous.get(bound, 0.0)
        total += after.sum if restarted else after.sum - before.sum
        count += after.count if restarted else after.count - before.count
    return Histogram(tuple(grown.items()), total, count)


def quantile(h: Histogram | None, q: float) -> float | None:
    """The q-quantile (0..1) of a histogram's observations, interpolated linearly within
    its bucket as Prometheus does; the highest finite bound when it falls in +Inf's."""
    if h is None or not h.buckets:
        return None
    total = h.buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in h.buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return lower_bound


def merge(histograms: Sequence[Histogram]) -> Histogram | None:
    """Several engines' histograms as one (the same buckets, as one vLLM version has)."""
    if len(histograms) <= 1:
        return histograms[0] if histograms else None
    buckets: dict[float, float] = defaultdict(float)
    for h in histograms:
        for bound, count in h.buckets:
            buckets[bound] += count
    return Histogram(
        tuple(sorted(buckets.items())),
        sum(h.sum for h in histograms),
        sum(h.count for h in histograms),
    )
