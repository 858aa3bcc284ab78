"""Prometheus metrics summed across the worker processes of `kvmigrate proxy --workers N`.

Counters, histograms and gauges live in prometheus-client's multiprocess mode: each worker
writes its values to memory-mapped files in `PROMETHEUS_MULTIPROC_DIR` (the parent creates
the folder and removes it at exit; a parent killed with SIGKILL cannot, so the next pool
removes the folders whose processes are all gone), and the worker a scrape reaches sums
them. Collectors that read a worker's own state at scrape time (the recorder's queue, open
connections) have no such file: each worker writes what they report to a snapshot file every
`SNAPSHOT_INTERVAL_S`, and the scraped worker adds the others' snapshots to its own live
values, so those figures are at most that old.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import tempfile
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
# `kvmigrate-metrics-<parent pid>-<random>`; the files in it end with a worker's pid
# (prometheus-client's `counter_<pid>.db`, the snapshots' `collected_<pid>.json`).
DIRECTORY_PREFIX = "kvmigrate-metrics-"
_OWNER = re.compile(re.escape(DIRECTORY_PREFIX) + r"(\d+)-")
_WORKER_FILE = re.compile(r"_(\d+)\.(?:db|json|tmp)$")

log = logging.getLogger("kvmigrate.proxy")


def new_pool_directory(root: str | None = None) -> str:
    """A metrics folder for this parent's pool, once the stale ones are gone."""
    removed = remove_stale_directories(root)
    if removed:
        log.info("removed %d metrics folder(s) left by killed proxy pools", len(removed))
    return tempfile.mkdtemp(prefix=f"{DIRECTORY_PREFIX}{os.getpid()}-", dir=root)


def remove_stale_directories(root: str | None = None) -> list[Path]:
    """Our folders (by name, and owned by this user) whose parent and workers are all dead:
    what a SIGKILLed pool leaves. A folder of a pool still running is never touched."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(DIRECTORY_PREFIX + "*"):
        owner = _OWNER.match(path.name)  # a folder named before parents' pids is left alone
        try:
            if not owner or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            workers = [int(m.group(1)) for f in os.listdir(path) if (m := _WORKER_FILE.search(f))]
        except OSError:
            continue  # gone meanwhile, or not a folder
        if not any(_alive(pid) for pid in (int(owner.group(1)), *workers)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


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
    families = [m for collector in live for m in collector.collect()]
    _write(Path(directory) / _SNAPSHOT.format(pid=os.getpid()), families)


def _write(path: Path, families: Iterable[Metric]) -> None:
    """`families` as a snapshot file, atomically replaced: a reader never sees half of it."""
    raw = [
        [m.name, m.type, m.documentation, [[s.name, s.labels, s.value] for s in m.samples]]
        for m in families
    ]
    partial = path.with_suffix(".tmp")
    partial.write_bytes(orjson.dumps(raw))
    partial.replace(path)


async def keep_snapshot(directory: str, live: Iterable[Collector]) -> None:
    """Write the snapshot every `SNAPSHOT_INTERVAL_S` until cancelled."""
    while True:
        await asyncio.to_thread(write_snapshot, directory, live)
        await asyncio.sleep(SNAPSHOT_INTERVAL_S)


def forget_worker(directory: str, pid: int) -> None:
    """A worker is gone: its live gauges no longer count, its counters do, so the pool's
    totals never go backwards (a drop reads to Prometheus' rate() as a reset). Its
    counters' files stay; its snapshot is replaced, in one step, by its counters alone (the
    recorder's, read at scrape time): removed, they were subtracted from every scrape."""
    mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    path = Path(directory) / _SNAPSHOT.format(pid=pid)
    counters = [family for family in _read(path) if family.type == "counter"]
    if counters:
        _write(path, counters)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


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
