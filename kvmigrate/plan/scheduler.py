"""One replica's engine: vLLM's continuous batching with chunked prefill, step by step.

Every step vLLM (V1) schedules the running requests first, one token for each sequence
that is decoding and the next chunk of each prompt still prefilling, then admits waiting
requests first come, first served, while the step's token budget
(`max_num_batched_tokens`) and sequence slots (`max_num_seqs`) last and their KV blocks
fit. A waiting request whose blocks do not fit blocks the ones behind it, as in vLLM. The
first token of a request comes at the end of the step that prefills its last prompt chunk.

A request reserves the blocks of its whole sequence (prompt and answer) when admitted, so
nothing is preempted later; vLLM allocates as it decodes and preempts when it runs out,
which only happens at the very edge of capacity. A request whose sequence needs more
blocks than the whole cache is refused on arrival, as vLLM refuses a request longer than
its `max_model_len` (which it will not set above what the cache holds): it never runs and
caches nothing.

Steps that only decode change nothing but counters until a request finishes or a new one
arrives, so they run as one stretch of `repeat` identical steps, cut short when an arrival
lands during it. That keeps a long recording's simulation in seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from kvmigrate.plan.cost_model import CostModel, attention_pairs
from kvmigrate.plan.prefix_cache import PrefixCache
from kvmigrate.plan.workload import Request


@dataclass(frozen=True, slots=True)
class EngineSettings:
    max_batched_tokens: int = 8192  # vLLM's default for online serving
    max_seqs: int = 256
    block_size: int = 16


@dataclass(slots=True)
class Job:
    """A request inside the simulation."""

    request: Request
    arrival: float
    replica: int = -1
    cached: int = 0
    remaining: int = -1  # prompt tokens left to prefill; -1 until admitted
    admitted_at: float = math.nan
    first_token_at: float = math.nan
    finished_at: float = math.nan
    refused: bool = False  # larger than the replica's whole KV cache: never ran


@dataclass(slots=True)
class Step:
    start: float
    duration: float
    repeat: int  # identical decode-only steps in a row; 1 for a step that prefills
    chunks: list[tuple[Job, int]]
    tokens: int = 0  # computed per step: the prompt chunks plus one per decoding sequence


@dataclass(slots=True)
class Engine:
    cache: PrefixCache
    cost: CostModel
    settings: EngineSettings
    waiting: deque[Job] = field(default_factory=deque)
    prefilling: list[Job] = field(default_factory=list)
    decoding: list[tuple[int, int, Job]] = field(default_factory=list)  # (done_at, n, job)
    decoded: int = 0  # decode steps run so far; a decoder finishes when this reaches done_at
    busy_s: float = 0.0  # time any step ran, however small
    tokens: int = 0  # tokens computed: prompt tokens prefilled plus one per decode step
    held_block_s: float = 0.0  # KV blocks held by running requests, integrated over time
    step: Step | None = None
    _joined: int = 0

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.decoding)

    def refuses(self, request: Request) -> bool:
        """Whether this replica could never run `request`: its sequence is larger than the
        whole KV cache (vLLM answers such a request with a 400)."""
        return not self.cache.fits(self._blocks(request))

    def start(self, now: float) -> float | None:
        """Schedule the next step at `now`; its end time, or None when idle."""
        decoders = len(self.decoding)
        budget = self.settings.max_batched_tokens - decoders
        chunks: list[tuple[Job, int]] = []
        prefill = cached = 0
        pairs = 0.0
        for job in self.prefilling:
            if budget <= 0:
                break
            chunk = min(job.remaining, budget)
            chunks.append((job, chunk))
            budget -= chunk
            prefill += chunk
            pairs += attention_pairs(job.request.prompt_tokens - job.remaining, chunk)
        while self.waiting and budget > 0 and self._running() < self.settings.max_seqs:
            job = self.waiting[0]
            if not self._admit(job, now):
                break
            self.waiting.popleft()
            self.prefilling.append(job)
            chunk = min(job.remaining, budget)
            chunks.append((job, chunk))
            budget -= chunk
            prefill += chunk
            cached += job.cached
            pairs += attention_pairs(job.cached, chunk)
        if not chunks and not decoders:
            self.step = None
            return None
        duration = self.cost.step_s(prefill, cached, decoders, pairs)
        repeat = 1 if chunks else self.decoding[0][0] - self.decoded
        self.step = Step(now, duration, repeat, chunks, prefill + decoders)
        return now + duration * repeat

    def cut(self, now: float) -> float | None:
        """An arrival at `now` during a stretch of decode-only steps: end the stretch after
        the step in progress, so the next step can admit it. The new end, or None when the
        current step already ends next."""
        step = self.step
        if step is None or step.repeat == 1:
            return None
        done = int((now - step.start) / step.duration) + 1
        if done >= step.repeat:
            return None
        step.repeat = done
        return step.start + step.duration * done

    def finish(self, end: float) -> list[Job]:
        """Apply the step that ends at `end`; the jobs that finished with it."""
        step = self.step
        assert step is not None, "finish without a step"
        self.step = None
        self.busy_s += step.duration * step.repeat
        self.tokens += step.tokens * step.repeat
        self.held_block_s += self.cache.pinned * step.duration * step.repeat
        if self.decoding:
            self.decoded += step.repeat
        finished: list[Job] = []
        while self.decoding and self.decoding[0][0] <= self.decoded:
            finished.append(heapq.heappop(self.decoding)[2])
        for job, chunk in step.chunks:
            job.remaining -= chunk
            if job.remaining:
                continue
            self.prefilling.remove(job)
            job.first_token_at = end + self.cost.request_s
            if job.request.output_tokens <= 1:
                finished.append(job)
            else:
                self._joined += 1
                done_at = self.decoded + job.request.output_tokens - 1
                heapq.heappush(self.decoding, (done_at, self._joined, job))
        for job in finished:
            job.finished_at = end + self.cost.request_s
            self.cache.release(job.request.chain, self._sequence(job))
        return finished

    def _running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def _sequence(self, job: Job) -> int:
        return job.request.prompt_tokens + job.request.output_tokens

    def _blocks(self, request: Request) -> int:
        return -(-(request.prompt_tokens + request.output_tokens) // self.settings.block_size)

    def _admit(self, job: Job, now: float) -> bool:
        request = job.request
        cached = self.cache.lookup(request.chain, request.prompt_tokens)
        if not self.cache.acquire(request.chain, self._blocks(request)):
            return False
        job.cached = cached
        job.remaining = request.prompt_tokens - cached
        job.admitted_at = now
        return True
