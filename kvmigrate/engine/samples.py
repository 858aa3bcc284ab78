"""Scrape results in the records database (`engine_samples`, migration m010), beside the
records they are read with: one row per scrape of one target, failed or not.

Stored there rather than held by the proxy: `kvmigrate report` is another process, often
run long after, and every proxy replica (each scraping) shares the records database, so
the report sees one fleet's samples over its window, kept and pruned with the records."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from kvmigrate.engine.gpu_util import GpuSample
from kvmigrate.engine.vllm_sample import EngineSample, Histogram
from kvmigrate.recorder.store import RecordStore

COLUMNS = (
    "ts", "source", "kind", "backend", "target", "error", "kv_usage", "running", "waiting",
    "prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens", "ttft", "itl",
    "gpu_util", "gpus", "absent", "bad_lines",
)  # fmt: skip
INSERT_SQL = (
    f"INSERT INTO engine_samples ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
)
SELECT_SQL = f"SELECT {', '.join(COLUMNS)} FROM engine_samples WHERE ts >= ? AND ts < ? ORDER BY ts"


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape of one target: what it read, or why it read nothing (`error`)."""

    ts: float
    kind: str  # vllm | dcgm | prometheus
    backend: str
    target: str  # the URL, without a password
    error: str | None = None
    engine: EngineSample | None = None
    gpu: GpuSample | None = None
    # Which scraper read it (a proxy replica or worker): each keeps its own series of one
    # engine's running totals, in the order it read them.
    source: str = ""


def write(store: RecordStore, results: Sequence[ScrapeResult], source: str) -> None:
    if results:
        store.execute_many(INSERT_SQL, [_row(r, source) for r in results])


def read(store: RecordStore, since: float, until: float) -> list[ScrapeResult]:
    return [_result(row) for row in store.query(SELECT_SQL, (since, until))]


def _row(r: ScrapeResult, source: str) -> tuple[object, ...]:
    e, g = r.engine, r.gpu
    return (
        r.ts, source, r.kind, r.backend, r.target, r.error,
        e and e.kv_usage, e and e.running, e and e.waiting,
        e and e.prefix_queries, e and e.prefix_hits, e and e.prompt_tokens,
        e and e.generation_tokens, _histogram_json(e.ttft if e else None),
        _histogram_json(e.itl if e else None),
        g and g.util_pct, g and g.gpus,
        ",".join(e.absent) if e else None,
        (e.bad_lines if e else 0) + (g.bad_lines if g else 0),
    )  # fmt: skip


def _result(row: Sequence[object]) -> ScrapeResult:
    values = dict(zip(COLUMNS, row, strict=True))
    error = values["error"]
    engine = gpu = None
    bad = int(values["bad_lines"] or 0)  # type: ignore[call-overload]
    if values["kind"] == "vllm" and error is None:
        engine = EngineSample(
            kv_usage=_float(values["kv_usage"]),
            running=_float(values["running"]),
            waiting=_float(values["waiting"]),
            prefix_queries=_float(values["prefix_queries"]),
            prefix_hits=_float(values["prefix_hits"]),
            prompt_tokens=_float(values["prompt_tokens"]),
            generation_tokens=_float(values["generation_tokens"]),
            ttft=_histogram(values["ttft"]),
            itl=_histogram(values["itl"]),
            absent=tuple(a for a in str(values["absent"] or "").split(",") if a),
            bad_lines=bad,
        )
    elif values["gpu_util"] is not None and error is None:
        gpus = values["gpus"]
        gpu = GpuSample(float(values["gpu_util"]), None if gpus is None else int(gpus), bad)  # type: ignore[arg-type, call-overload]
    return ScrapeResult(
        ts=float(values["ts"]),  # type: ignore[arg-type]
        kind=str(values["kind"]),
        backend=str(values["backend"]),
        target=str(values["target"]),
        error=None if error is None else str(error),
        engine=engine,
        gpu=gpu,
        source=str(values["source"] or ""),
    )


def _float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _histogram_json(h: Histogram | None) -> str | None:
    if h is None:
        return None
    # +Inf as null: JSON has no infinity.
    buckets = [[None if b == float("inf") else b, c] for b, c in h.buckets]
    return orjson.dumps({"buckets": buckets, "sum": h.sum, "count": h.count}).decode()


def _histogram(text: object) -> Histogram | None:
    if not isinstance(text, str):
        return None
    data = orjson.loads(text)
    buckets = tuple((float("inf") if b is None else float(b), float(c)) for b, c in data["buckets"])
    return Histogram(buckets, float(data["sum"]), float(data["count"]))
