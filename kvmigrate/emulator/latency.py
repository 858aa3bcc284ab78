"""The latency model: time to first token from prefill work and queueing, then paced decode.

A request's prefill takes

    base + uniform(0, jitter) + (uncached + cached_token_cost * cached) / prefill_tokens_per_s

seconds, all times `time_scale`. Prefills pass through a FIFO engine that runs at most
`engine_concurrency` at once, so concurrent long prompts queue behind each other and the
queueing shows up in TTFT, as on a real GPU. Decode is not queued: each further token follows
the previous one after 1 / decode_tokens_per_s seconds. With `time_scale` 0 nothing sleeps.
See `LatencySettings` for the defaults and where they come from.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

from kvmigrate.emulator.settings import LatencySettings


class LatencyModel:
    def __init__(self, settings: LatencySettings, time_scale: float, rng: random.Random) -> None:
        self._settings = settings
        self._scale = time_scale
        self._rng = rng

    @property
    def time_scale(self) -> float:
        return self._scale

    def prefill_s(self, prompt_tokens: int, cached_tokens: int) -> float:
        if self._scale == 0:
            return 0.0
        s = self._settings
        work = (prompt_tokens - cached_tokens) + s.cached_token_cost * cached_tokens
        jitter = self._rng.uniform(0.0, s.ttft_jitter_s) if s.ttft_jitter_s > 0 else 0.0
        return (s.ttft_base_s + jitter + work / s.prefill_tokens_per_s) * self._scale

    def token_gap_s(self) -> float:
        return self._scale / self._settings.decode_tokens_per_s

    def scaled(self, seconds: float) -> float:
        return seconds * self._scale


class PrefillEngine:
    """Admits requests to prefill in arrival order, a limited number at a time.

    `waiting` counts requests queued for a prefill slot, `running` those admitted and not yet
    finished (prefilling or decoding), as vLLM's scheduler gauges do."""

    def __init__(self, concurrency: int) -> None:
        self._slots = asyncio.Semaphore(max(concurrency, 1))
        self.waiting = 0
        self.running = 0
        self.kv_tokens = 0  # held by the running requests, as vLLM's KV-cache gauge counts
        # Wall time with a request running: what the emulated GPU was busy for.
        self._busy_s = 0.0
        self._busy_since: float | None = None

    def busy_seconds(self) -> float:
        """Seconds so far with at least one request running (prefilling or decoding)."""
        ongoing = 0.0 if self._busy_since is None else time.monotonic() - self._busy_since
        return self._busy_s + ongoing

    def _start(self, tokens: int) -> None:
        if self.running == 0:
            self._busy_since = time.monotonic()
        self.running += 1
        self.kv_tokens += tokens

    def _end(self, tokens: int) -> None:
        self.running -= 1
        self.kv_tokens -= tokens
        if self.running == 0 and self._busy_since is not None:
            self._busy_s += time.monotonic() - self._busy_since
            self._busy_since = None

    @contextlib.asynccontextmanager
    async def admitted(self, prefill_s: float, tokens: int = 0) -> AsyncIterator[None]:
        """`tokens`: the KV cache the request holds from admission to its end (its prompt
        and its answer: vLLM allocates blocks as it decodes, the emulator at once)."""
        self.waiting += 1
        queued = True
        try:
            if prefill_s > 0:
                async with self._slots:
                    self.waiting -= 1
                    queued = False
                    self._start(tokens)
                    await asyncio.sleep(prefill_s)
            else:
                self.waiting -= 1
                queued = False
                self._start(tokens)
            yield
        finally:
            if queued:
                self.waiting -= 1
            else:
                self._end(tokens)
