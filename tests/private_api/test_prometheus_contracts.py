"""What kvmigrate relies on of prometheus-client's internals still holds for the installed
version: the names in `kvmigrate.vendor_internals.prometheus_internals.PRIVATE_NAMES` are
where the helpers reach for them, and a histogram filled in bulk (ProxyMetrics' folds)
exposes what observing each value would have, in one process and in multiprocess mode
(`proxy --workers`). A failure names the attribute and the kvmigrate feature that needs it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from bisect import bisect_left
from importlib.metadata import version
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram

from kvmigrate.vendor_internals import prometheus_internals as internals
from kvmigrate.vendor_internals.prometheus_internals import PRIVATE_NAMES

VERSION = version("prometheus-client")
BOUNDS = (0.01, 0.1, 1.0, 10.0)
INF = float("inf")


def moved(name: str, what: str) -> str:
    return (
        f"prometheus-client {VERSION}: {what}. kvmigrate needs `{name}` for: "
        f"{PRIVATE_NAMES[name]} (kvmigrate/vendor_internals/prometheus_internals.py)"
    )


def histograms(labelled: bool) -> tuple[Histogram, Histogram]:
    """(the labelled parent or the histogram, the child values are added to)."""
    labels = ["backend"] if labelled else []
    parent = Histogram("h", "h", labels, buckets=BOUNDS, registry=CollectorRegistry())
    return parent, parent.labels("a") if labelled else parent


def test_every_private_name_has_a_contract() -> None:
    assert set(PRIVATE_NAMES) == {"_upper_bounds", "_buckets", "_sum"}


@pytest.mark.parametrize("labelled", [False, True])
def test_upper_bounds_are_the_buckets_then_infinity(labelled: bool) -> None:
    parent, child = histograms(labelled)
    for histogram in (parent, child):
        assert internals.upper_bounds(histogram) == (*BOUNDS, INF), moved(
            "_upper_bounds", "a Histogram's _upper_bounds are not its bounds and +Inf"
        )


@pytest.mark.parametrize("labelled", [False, True])
def test_buckets_and_sum_are_per_bucket_values(labelled: bool) -> None:
    _parent, child = histograms(labelled)
    buckets = getattr(child, "_buckets", None)
    assert isinstance(buckets, list), moved("_buckets", "a Histogram child has no _buckets list")
    assert len(buckets) == len(BOUNDS) + 1, moved("_buckets", "one value per bound no more")
    child.observe(0.05)
    child.observe(0.5)
    child.observe(0.7)
    assert [value.get() for value in buckets] == [0, 1, 2, 0, 0], moved(
        "_buckets", "_buckets are no longer per-bucket (non-cumulative) counts"
    )
    total = getattr(child, "_sum", None)
    assert hasattr(total, "inc"), moved("_sum", "a Histogram child has no _sum value with inc()")
    assert total.get() == pytest.approx(1.25), moved("_sum", "_sum is not the observations' sum")


def _tallied(values: list[float]) -> tuple[list[float], float]:
    """Per-bucket counts and the sum, as ProxyMetrics tallies them."""
    bounds = (*BOUNDS, INF)
    counts = [0.0] * len(bounds)
    for value in values:
        counts[bisect_left(bounds, value)] += 1
    return counts, sum(values)


def _samples(histogram: Histogram) -> list[tuple[str, dict[str, str], float]]:
    """What a scrape reads of `histogram`, less `_created` (when the child was made)."""
    return [
        (s.name, s.labels, round(s.value, 9))
        for m in histogram.collect()
        for s in m.samples
        if not s.name.endswith("_created")
    ]


VALUES = [0.0, 0.01, 0.010001, 0.1, 5.0, 10.0, 11.0, 1e9, *random.Random(7).choices(
    [0.003, 0.05, 0.5, 2.0, 99.0], k=200
)]  # fmt: skip


@pytest.mark.parametrize("labelled", [False, True])
def test_added_in_bulk_exposes_what_observing_each_would(labelled: bool) -> None:
    one, by_one = histograms(labelled)
    bulk, in_bulk = histograms(labelled)
    for value in VALUES:
        by_one.observe(value)
    internals.add_observations(in_bulk, *_tallied(VALUES))
    assert _samples(bulk) == _samples(one), moved(
        "_buckets", "values added to _buckets and _sum read differently from observe's"
    )


_MULTIPROCESS = """
import json, sys
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.multiprocess import MultiProcessCollector
from kvmigrate.vendor_internals.prometheus_internals import add_observations
counts, total, values = json.loads(sys.argv[1])
by_one = Histogram("one", "h", ["b"], buckets={bounds}).labels("a")
for value in values:
    by_one.observe(value)
add_observations(Histogram("bulk", "h", ["b"], buckets={bounds}).labels("a"), counts, total)
registry = CollectorRegistry()
MultiProcessCollector(registry)
out = {{}}
for metric in registry.collect():
    out[metric.name] = sorted(
        (s.name.split("_", 1)[1], s.labels.get("le", ""), round(s.value, 9))
        for s in metric.samples
    )
print(json.dumps(out))
"""


def test_added_in_bulk_in_multiprocess_mode(tmp_path: Path) -> None:
    """With `--workers`, the values are memory-mapped files (another value class)."""
    counts, total = _tallied(VALUES)
    script = _MULTIPROCESS.format(bounds=BOUNDS)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", script, json.dumps([counts, total, VALUES])],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["bulk"] == out["one"], moved(
        "_buckets", "in multiprocess mode, bulk-added values read differently from observe's"
    )
