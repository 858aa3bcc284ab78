"""Fit the cost model to a real OpenAI-compatible endpoint with a short probe.

The probe is the bench's own runner, one conversation at a time so no request waits for
another: for each prompt length (`repeats` times) a conversation of a few turns, whose
first turn is cold and whose later turns find their history cached. Then a few short
requests decode together, to measure what one more sequence adds to a decode step. Each
turn's TTFT, prompt tokens and `usage.prompt_tokens_details.cached_tokens` become a
`Probe`; a warm-up conversation runs first and is not counted (a server's first
requests pay for compilation and allocation).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import openai

from kvmigrate.bench import RunSettings, Target, TurnRecord, run_bench, synthetic
from kvmigrate.config import safe_text, safe_url
from kvmigrate.plan.cost_model import CostModel, Probe, fit

DEFAULT_LENGTHS = (256, 1024, 4096)
TURNS = 3
TURN_TOKENS = 32
MAX_TOKENS = 16
BATCH = 4  # sequences decoding together, to measure what one more adds to a step


class CalibrationError(RuntimeError):
    """The endpoint could not be probed; the message names it (never its key) and why."""


KEY_REFUSED = (401, 403)
_SDK_PREFIX = re.compile(r"Error code: \d+ - ")  # the openai SDK's, before the server's text


def describe(exc: openai.APIError, url: str) -> str:
    """A failed call in a line: where, the HTTP status, and what to do. The server's own
    text is left out when it refused the key, since servers quote part of the key back."""
    where = safe_url(url)
    if isinstance(exc, openai.APITimeoutError):
        return f"{where} did not answer in time"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        why = f": {safe_text(f'{type(cause).__name__}: {cause}')}" if cause else ""
        return f"cannot connect to {where}{why}"
    status = getattr(exc, "status_code", None)
    if status in KEY_REFUSED:
        return (
            f"{where} refused the API key (HTTP {status}); pass the endpoint's key with "
            "--api-key or KVMIGRATE_BENCH_API_KEY"
        )
    if status is not None:
        return f"{where} answered HTTP {status}: {safe_text(_SDK_PREFIX.sub('', exc.message))}"
    return f"{where}: {safe_text(f'{type(exc).__name__}: {exc.message}')}"


def _turn_error(error: str) -> str:
    """A probe turn's recorded error, its text dropped when the key was refused."""
    for status in KEY_REFUSED:
        if error.startswith(f"http {status}:"):
            return f"HTTP {status}: the API key was refused; pass it with --api-key"
    return _SDK_PREFIX.sub("", error)


def probes(records: Sequence[TurnRecord]) -> list[Probe]:
    """One probe per answered turn. A server that does not report cached tokens is taken
    to cache each turn's previous prompt (vLLM without --enable-prompt-tokens-details)."""
    out: list[Probe] = []
    previous: dict[str, int] = {}
    for r in sorted(records, key=lambda r: (r.conversation, r.turn)):
        if r.error is not None or r.ttft_s is None or not r.prompt_tokens:
            continue
        cached = r.cached_tokens
        if cached is None:
            cached = previous.get(r.conversation, 0) if r.turn > 1 else 0
        out.append(Probe(r.prompt_tokens, min(cached, r.prompt_tokens), r.ttft_s, _itl(r)))
        previous[r.conversation] = r.prompt_tokens
    return out


def _itl(record: TurnRecord) -> float | None:
    if record.latency_s is None or record.ttft_s is None or not record.completion_tokens:
        return None
    if record.completion_tokens < 2:
        return None
    return (record.latency_s - record.ttft_s) / (record.completion_tokens - 1)


async def _probe(
    target: Target, lengths: Sequence[int], repeats: int, seed: int
) -> tuple[list[TurnRecord], list[float]]:
    """The single-request records, and the inter-token times of a batch decoding together."""
    alone = RunSettings(concurrency=1, max_tokens=MAX_TOKENS, temperature=0.0)
    warm = synthetic(1, 1, min(lengths), TURN_TOKENS, seed)
    failed = [r.error for r in (await run_bench(target, warm, alone)).records if r.error]
    if failed:  # the server refuses or breaks every request: say so now, not after 18
        raise CalibrationError(
            f"the warm-up request to {safe_url(target.base_url)} failed: {_turn_error(failed[0])}"
        )
    records: list[TurnRecord] = []
    for _ in range(repeats):
        for length in lengths:
            conversation = synthetic(1, TURNS, length, TURN_TOKENS, seed)
            records.extend((await run_bench(target, conversation, alone)).records)
    together = RunSettings(concurrency=BATCH, max_tokens=4 * MAX_TOKENS, temperature=0.0)
    batch = await run_bench(target, synthetic(BATCH, 1, 32, 8, seed), together)
    itls = [itl for itl in map(_itl, batch.records) if itl is not None]
    return records, itls


def probe_endpoint(
    target: Target, lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = 2, seed: int = 0
) -> tuple[list[TurnRecord], list[float]]:
    """The probe's raw measurements: each single-request turn, and the inter-token times of
    `BATCH` sequences decoding together. Kept apart from the fit so a run on one machine
    can be fitted again elsewhere."""
    try:
        return asyncio.run(_probe(target, lengths, repeats, seed))
    except openai.APIError as exc:
        raise CalibrationError(describe(exc, target.base_url)) from None


def fit_probe(records: Sequence[TurnRecord], batch_itls: Sequence[float], label: str) -> CostModel:
    """The cost model fitted to a probe's raw measurements."""
    measured = probes(records)
    failed = [r.error for r in records if r.error is not None]
    if failed:
        raise CalibrationError(
            f"{len(failed)} of {len(records)} probe requests to {safe_url(label)} failed; "
            f"the first: {_turn_error(failed[0])}"
        )
    if len(records) > len(measured) or not batch_itls:
        raise CalibrationError(f"probe requests to {safe_url(label)} measured no TTFT")
    batch = (BATCH, sorted(batch_itls)[len(batch_itls) // 2])
    return fit(measured, f"calibrated against {label}", batch)


def calibrate(
    target: Target, lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = 2, seed: int = 0
) -> tuple[CostModel, list[Probe]]:
    """The fitted cost model and the probes it was fitted to."""
    records, batch_itls = probe_endpoint(target, lengths, repeats, seed)
    return fit_probe(records, batch_itls, target.base_url), probes(records)
