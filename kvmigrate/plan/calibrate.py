"""Fit the cost model to a real OpenAI-compatible endpoint with a short probe.

The probe is the bench's own runner, one conversation at a time so no request waits for
another: for each prompt length a conversation of a few turns, whose first turn is cold
and whose later turns find their history cached. Each turn's TTFT, prompt tokens and
`usage.prompt_tokens_details.cached_tokens` become a `Probe`; a warm-up conversation runs
first and is not counted (a server's first requests pay for compilation and allocation).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kvmigrate.bench import RunSettings, Target, TurnRecord, run_bench, synthetic
from kvmigrate.plan.cost_model import CostModel, Probe, fit

DEFAULT_LENGTHS = (256, 1024, 4096)
TURNS = 3
TURN_TOKENS = 32
MAX_TOKENS = 16


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
        itl = None
        if r.latency_s is not None and r.completion_tokens and r.completion_tokens > 1:
            itl = (r.latency_s - r.ttft_s) / (r.completion_tokens - 1)
        out.append(Probe(r.prompt_tokens, min(cached, r.prompt_tokens), r.ttft_s, itl))
        previous[r.conversation] = r.prompt_tokens
    return out


async def _probe(target: Target, lengths: Sequence[int], seed: int) -> list[TurnRecord]:
    settings = RunSettings(concurrency=1, max_tokens=MAX_TOKENS, temperature=0.0)
    warm = synthetic(1, 1, min(lengths), TURN_TOKENS, seed)
    await run_bench(target, warm, settings)
    records: list[TurnRecord] = []
    for length in lengths:
        conversation = synthetic(1, TURNS, length, TURN_TOKENS, seed)
        records.extend((await run_bench(target, conversation, settings)).records)
    return records


def calibrate(
    target: Target, lengths: Sequence[int] = DEFAULT_LENGTHS, seed: int = 0
) -> tuple[CostModel, list[Probe]]:
    """The fitted cost model and the probes it was fitted to."""
    measured = probes(asyncio.run(_probe(target, lengths, seed)))
    failed = len(lengths) * TURNS - len(measured)
    if failed:
        raise RuntimeError(f"{failed} probe request(s) failed; is {target.base_url} serving?")
    return fit(measured, f"calibrated against {target.base_url}"), measured
