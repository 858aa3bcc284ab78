"""Prometheus metrics summed across the worker processes of `kvmigrate proxy --workers N`.

Counters, histograms and gauges live in prometheus-client's multiprocess mode: each worker
writes its values to memory-mapped files in `PROMETHEUS_MULTIPROC_DIR` (the parent creates
the folder and removes it at exit), and the worker a scrape reaches sums them. Collectors
that read a worker's own state at scrape time (the recorder's queue, open connections) have
no such file: each worker writes what they report to a snapshot file every
`SNAPSHOT_INTERVAL_S`, and the scraped worker adds the others' snapshots to its own live
values, so those figures are at most that old.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SNAPSHOT_INTERVAL_S = 1.0
_SNAPSHOT = "collected_{pid}.json"


def pool_directory() -> str | None:
    """The shared metrics folder when this process is one worker of several, else None."""
    return os.environ.get(MULTIPROC_ENV) or None


class TrackingRegistry(CollectorRegistry):
    """A registry that remembers which collectors are not metric objects (those that
    multiprocess mode cannot see): they are the ones the snapshots carry."""

    def __init__(self) -> None:
        super().__init__(auto_describe=True)
        self.live: list[Collector] = []

    def register(self, collector: Collector) -> None:
        super().register(collector)
        if not isinstance(collector, MetricWrapperBase):
            self.live.append(collector)


def render_pool(directory: str, live: Iterable[Collector]) -> bytes:
    """The exposition text for the whole pool, as one worker sees it at a scrape."""
    files = CollectorRegistry()
    MultiProcessCollector(files, path=directory)  # type: ignore[no-untyped-call]
    own = [metric for collector in live for metric in collector.collect()]
    others = [
        family
        for path in Path(directory).glob(_SNAPSHOT.format(pid="*"))
        if path.name != _SNAPSHOT.format(pid=os.getpid())
        for family in _read(path)
    ]
    summed = CollectorRegistry()
    summed.register(_Fixed(_sum([*own, *others])))
    return generate_latest(files) + generate_latest(summed)


def write_snapshot(directory: str, live: Iterable[Collector]) -> None:
    """This worker's live collectors, for the other workers' scrapes (atomically replaced)."""
    families = [
        [m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]]
        for collector in live
        for m in collector.collect()
    ]
    path = Path(directory) / _SNAPSHOT.format(pid=os.getpid())
    partial = path.with_suffix(".tmp")
    partial.write_bytes(orjson.dumps(families))
    partial.replace(path)


async def keep_snapshot(directory: str, live: Iterable[Collector]) -> None:
    """Write the snapshot every `SNAPSHOT_INTERVAL_S` until cancelled."""
    while True:
        await asyncio.to_thread(write_snapshot, directory, live)
        await asyncio.sleep(SNAPSHOT_INTERVAL_S)


def forget_worker(directory: str, pid: int) -> None:
    """A worker is gone: its live gauges and its snapshot no longer count. (Its counters'
    files stay, so the pool's totals never go backwards.)"""
    mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    with contextlib.suppress(FileNotFoundError):
        (Path(directory) / _SNAPSHOT.format(pid=pid)).unlink()


def _read(path: Path) -> list[Metric]:
    try:
        raw: list[list[Any]] = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):  # a worker that died mid-write
        return []
    families = []
    for name, kind, documentation, samples in raw:
        metric = Metric(name, documentation, kind)
        for sample_name, labels, value in samples:
            metric.add_sample(sample_name, labels, value)
        families.append(metric)
    return families


def _sum(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, each sample the sum of the same sample's values across workers."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for family in families:
        if family.name not in merged:
            merged[family.name] = Metric(family.name, family.documentation, family.type)
            values[family.name] = {}
        into = values[family.name]
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            into[key] = into.get(key, 0.0) + sample.value
    for name, metric in merged.items():
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
    return list(merged.values())


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
