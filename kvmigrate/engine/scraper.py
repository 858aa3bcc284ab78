"""The GPU scrape as a proxy addon: every `gpu.interval_seconds`, each target's answer is
fetched on the event loop (non-blocking, bounded in time and size), then read and stored on
a thread of its own, so neither a slow exporter nor a large answer nor a locked database
reaches the response path. A failure of any kind is a stored result with its reason, and a
count (`kvmigrate_gpu_scrapes_total{kind,result}`), never an exception out of the loop."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from kvmigrate.config import Config, safe_url
from kvmigrate.engine import samples
from kvmigrate.engine.gpu_util import UnreadableAnswer, read_dcgm, read_prometheus
from kvmigrate.engine.samples import ScrapeResult
from kvmigrate.engine.targets import Target, scrape_targets
from kvmigrate.engine.vllm_sample import read_vllm
from kvmigrate.logtext import printable
from kvmigrate.recorder.store import RecordStore, database_errors, open_store
from kvmigrate.supervisor import Supervisor

log = logging.getLogger("kvmigrate.engine")

RESULTS = ("ok", "timeout", "too_large", "http_error", "connect_error", "unreadable")
ERROR_CHARS = 300  # a stored reason: what an exporter said, cut short


class ScrapeFailed(Exception):
    def __init__(self, result: str, reason: str) -> None:
        super().__init__(reason)
        self.result = result


class GpuScraper:
    def __init__(
        self, config: Config, supervisor: Supervisor | None = None, source: str | None = None
    ) -> None:
        self.targets: tuple[Target, ...] = scrape_targets(config)
        self.settings = config.gpu
        self.db = config.record.db
        self.source = source or f"{socket.gethostname()}:{os.getpid()}"
        self.supervisor = supervisor or Supervisor()
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.write_errors = 0
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        # One thread: reading answers and writing samples, in order, off the event loop.
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="gpu-scrape")
        self._store: RecordStore | None = None

    # -- addon events -----------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        registry.register(_ScrapeCollector(self))

    async def running(self) -> None:
        if self.targets:
            self.open()
            self._task = self.supervisor.start("gpu-scrape", self._loop)

    async def done(self) -> None:
        await self.supervisor.stop(self._task)
        await self.close()

    # -- direct use (tests, a one-off scrape) -----------------------------------------------

    def open(self) -> None:
        """The HTTP session of the running event loop, which `scrape_once` uses."""
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max(1, len(self.targets))),
            auto_decompress=True,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await asyncio.get_running_loop().run_in_executor(self._thread, self._close_store)
        self._thread.shutdown(wait=False)

    # -- the work ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self.scrape_once()
            await asyncio.sleep(self.settings.interval_seconds)

    async def scrape_once(self) -> list[ScrapeResult]:
        """Every target once, at the same time; their results stored and returned."""
        started = time.time()
        answers = await asyncio.gather(*(self._fetch(t) for t in self.targets))
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._read_and_store, started, answers)

    async def _fetch(self, target: Target) -> bytes | ScrapeFailed:
        assert self._session is not None
        timeout = self.settings.timeout_seconds
        try:
            async with (
                asyncio.timeout(timeout),
                self._session.get(target.url, allow_redirects=False) as response,
            ):
                if response.status != 200:
                    return ScrapeFailed("http_error", f"HTTP {response.status}")
                return await _capped(response, self.settings.max_body_bytes)
        except TimeoutError:
            return ScrapeFailed("timeout", f"no whole answer within {timeout:g} s")
        except ScrapeFailed as failed:
            return failed
        except (aiohttp.ClientError, OSError) as exc:
            return ScrapeFailed("connect_error", f"{type(exc).__name__}: {exc}")

    def _read_and_store(self, ts: float, answers: list[bytes | ScrapeFailed]) -> list[ScrapeResult]:
        results = [_read(ts, t, a) for t, a in zip(self.targets, answers, strict=True)]
        for result in results:
            outcome = result.error.split(":", 1)[0] if result.error else "ok"
            self.counts[result.kind, outcome if outcome in RESULTS else "unreadable"] += 1
        try:
            if self._store is None:
                self._store = open_store(self.db)
            samples.write(self._store, results, self.source)
        except database_errors() as exc:
            self.write_errors += 1
            log.warning("gpu scrape: storing samples failed: %s", printable(exc))
            self._close_store()
        return results

    def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            store.close()


async def _capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > limit:
            raise ScrapeFailed("too_large", f"the answer is larger than {limit:,} bytes")
    return bytes(body)


def _read(ts: float, target: Target, answer: bytes | ScrapeFailed) -> ScrapeResult:
    """What one answer says. A failure's reason is stored as `result: reason`."""
    where = safe_url(target.url)
    base = ScrapeResult(ts, target.kind, target.backend, where)
    if isinstance(answer, ScrapeFailed):
        return _failed(base, answer.result, str(answer))
    text = answer.decode("utf-8", "replace")
    try:
        if target.kind == "vllm":
            engine = read_vllm(text)
            if engine.empty:
                unread = f" ({engine.bad_lines} unreadable lines)" if engine.bad_lines else ""
                return _failed(base, "unreadable", f"no vLLM metric in the answer{unread}")
            return ScrapeResult(ts, target.kind, target.backend, where, engine=engine)
        gpu = read_dcgm(text) if target.kind == "dcgm" else read_prometheus(answer)
        return ScrapeResult(ts, target.kind, target.backend, where, gpu=gpu)
    except UnreadableAnswer as exc:
        return _failed(base, "unreadable", str(exc))


def _failed(base: ScrapeResult, result: str, reason: str) -> ScrapeResult:
    error = printable(f"{result}: {reason}", ERROR_CHARS)
    return ScrapeResult(base.ts, base.kind, base.backend, base.target, error=error)


class _ScrapeCollector:
    """The scrape counts, read at the proxy's own scrape time."""

    def __init__(self, scraper: GpuScraper) -> None:
        self._scraper = scraper

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "kvmigrate_gpu_scrapes",
            "Scrapes of the candidates' vLLM /metrics and GPU sources, by kind and result "
            "(ok, timeout, too_large, http_error, connect_error, unreadable).",
            labels=["kind", "result"],
        )
        for (kind, result), count in sorted(self._scraper.counts.items()):
            family.add_metric([kind, result], count)
        yield family
        errors = CounterMetricFamily(
            "kvmigrate_gpu_sample_write_errors", "Scrape results the records database refused."
        )
        errors.add_metric([], self._scraper.write_errors)
        yield errors
