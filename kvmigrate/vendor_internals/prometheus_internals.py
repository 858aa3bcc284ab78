"""prometheus-client's private internals that kvmigrate's metrics rely on, and why.

The proxy tallies its histograms' observations per bucket on the response path and adds them
to prometheus-client in bulk at each fold (proxy/metrics.py: `ProxyMetrics.observe`, `fold`).
`Histogram.observe` takes one value at a time, with a lock per value (and with `--workers`,
a memory-mapped write per value): prometheus-client has no bulk form, nor a public view of a
histogram's bucket bounds. Each private name is listed in `PRIVATE_NAMES` with what needs
it, and touched only here.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Histogram

LIBRARY = "prometheus_client"

PRIVATE_NAMES: dict[str, str] = {
    "_upper_bounds": "a Histogram's bucket bounds as floats, ascending, +Inf last (on the "
    "labelled parent and each child): ProxyMetrics tallies an observation into the first "
    "bound >= it, as Histogram.observe counts it",
    "_buckets": "a Histogram child's per-bucket values (not cumulative; made so when "
    "collected), one per bound, each with inc(): ProxyMetrics.fold adds its tallies to them",
    "_sum": "a Histogram child's running sum, a value with inc(): ProxyMetrics.fold adds "
    "its tallied total to it",
}


def upper_bounds(histogram: Histogram) -> tuple[float, ...]:
    """The histogram's bucket bounds, ascending, +Inf last."""
    return tuple(histogram._upper_bounds)


def add_observations(histogram: Histogram, counts: Sequence[float], total: float) -> None:
    """Observations already counted per bucket (`counts[i]`: values above bucket i-1's
    bound, up to bucket i's, +Inf last) and summed, added as `observe` would have added
    them one by one. `histogram` is a child (or a histogram without labels)."""
    buckets = histogram._buckets
    if len(counts) != len(buckets):
        raise ValueError(f"{len(counts)} bucket counts for a histogram of {len(buckets)}")
    for value, count in zip(buckets, counts, strict=True):
        if count:
            value.inc(count)
    histogram._sum.inc(total)
