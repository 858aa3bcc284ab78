"""Offline replay: each dataset request to the candidate once and to the primary 1 + K times.

The primary's first answer is what the candidate is held to; the K repeats, compared with
that first answer, give the noise floor. Backends are called directly (their `api_base`,
`api_key` and served model name from the config), never through the proxy. A hosted key
never reaches the candidate: the candidate gets its own configured key or none. Answers
are compared, never acted on: no tool call is executed.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson

from kvmigrate.capped_body import read_capped
from kvmigrate.config import BackendConfig, Config, Secret, safe_url
from kvmigrate.parity.compare import DEFAULT_SETTINGS, score_exchange_pair
from kvmigrate.parity.dataset import DatasetItem
from kvmigrate.parity.result import PairScore
from kvmigrate.parity.semantic import SemanticScorer
from kvmigrate.parity.settings import ParitySettings
from kvmigrate.proxy.kinds import BackendKind, kind_of
from kvmigrate.wire.anthropic import DEFAULT_VERSION, MESSAGES_ROUTES


@dataclass(frozen=True, slots=True)
class Target:
    """One backend to call: `models` maps the client's model name to the served one;
    `kind` builds its URLs and carries its key as its API reads it."""

    name: str
    base_url: str
    api_key: str | None
    models: dict[str, str]
    kind: BackendKind = field(default_factory=BackendKind)

    def __repr__(self) -> str:  # the key must never reach a log
        return f"Target({self.name!r}, {safe_url(self.base_url)!r})"


def targets_from_config(
    config: Config, primary_key: str | None = None, env: Mapping[str, str] = os.environ
) -> tuple[Target, Target]:
    """(primary, candidate). A primary without `api_key` uses `primary_key`, else the
    variable its own API's SDK reads (`OPENAI_API_KEY`, `AZURE_OPENAI_API_KEY`,
    `ANTHROPIC_API_KEY`), as the proxy passes the client's key to the primary only. Never
    another provider's: an OpenAI key is not sent to Anthropic. The candidate gets only its
    own configured key."""
    kind = kind_of(config.primary)
    fallback = primary_key
    if fallback is None and kind.key_env is not None:
        fallback = env.get(kind.key_env)
    return (
        _target(config, config.primary, fallback),
        _target(config, config.candidate, None),
    )


def _target(config: Config, backend: BackendConfig, fallback_key: str | None) -> Target:
    models = {
        r.model_name: served
        for r in config.models
        if (served := r.served_name(backend.name)) is not None
    }
    key = backend.api_key.reveal() if backend.api_key is not None else fallback_key
    base = backend.direct_api_bases("parity")[0]
    return Target(backend.name, base.rstrip("/"), key, models, kind_of(backend))


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """repeats: extra primary calls per request, for the noise floor.
    concurrency: requests in flight at once (each with its 2 + repeats calls).
    timeout_s: per call."""

    repeats: int = 1
    concurrency: int = 8
    timeout_s: float = 120.0
    parity: ParitySettings = DEFAULT_SETTINGS


@dataclass(frozen=True, slots=True)
class Call:
    status: int | None
    body: bytes
    error: str | None = None  # connect_error, timeout, http_<status>, ...


@dataclass(frozen=True, slots=True)
class ItemResult:
    item: DatasetItem
    primary: Call | None = None
    candidate: Call | None = None
    repeats: tuple[Call, ...] = ()
    candidate_score: PairScore | None = None
    noise_scores: tuple[PairScore, ...] = ()
    skipped: str | None = None


@dataclass
class _Run:
    session: aiohttp.ClientSession
    primary: Target
    candidate: Target
    settings: ReplaySettings
    semantic: SemanticScorer | None
    on_done: Callable[[ItemResult], None]
    results: list[ItemResult | None] = field(default_factory=list)


async def call_backend(
    session: aiohttp.ClientSession, target: Target, item: DatasetItem, timeout_s: float
) -> Call:
    served = target.models[item.body["model"]]
    body = {**item.body, "model": served}
    headers = {"Content-Type": "application/json"}
    if item.route in MESSAGES_ROUTES:
        headers["anthropic-version"] = DEFAULT_VERSION
    if target.api_key:
        headers.update(target.kind.auth_headers(Secret(target.api_key)))
    url = target.kind.url(target.base_url, item.route, served)
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with session.post(
            url, data=orjson.dumps(body), headers=headers, timeout=timeout
        ) as r:
            raw = await read_capped(r)  # an endless body ends as an error, not in memory
            return Call(r.status, raw, f"http_{r.status}" if r.status >= 400 else None)
    except TimeoutError:
        return Call(None, b"", "timeout")
    except aiohttp.ClientConnectorError:
        return Call(None, b"", "connect_error")
    except aiohttp.ClientError as exc:
        # A body cut off mid-way (a dropped connection) is an error of that call only.
        return Call(None, b"", type(exc).__name__)


def _score(item: DatasetItem, first: Call, other: Call, run: _Run) -> PairScore:
    return score_exchange_pair(
        item.route,
        orjson.dumps(item.body),
        first.body,
        first.status,
        other.body,
        other.status,
        settings=run.settings.parity,
        semantic=run.semantic,
    )


async def replay_item(item: DatasetItem, run: _Run) -> ItemResult:
    model = item.body["model"]
    for target in (run.primary, run.candidate):
        if model not in target.models:
            return ItemResult(item, skipped=f"model {model!r} has no `{target.name}` mapping")
    timeout = run.settings.timeout_s
    calls = await asyncio.gather(
        call_backend(run.session, run.primary, item, timeout),
        call_backend(run.session, run.candidate, item, timeout),
        *(
            call_backend(run.session, run.primary, item, timeout)
            for _ in range(run.settings.repeats)
        ),
    )
    first, candidate, repeats = calls[0], calls[1], tuple(calls[2:])
    return ItemResult(
        item,
        first,
        candidate,
        repeats,
        _score(item, first, candidate, run),
        tuple(_score(item, first, r, run) for r in repeats),
    )


async def _worker(queue: asyncio.Queue[tuple[int, DatasetItem]], run: _Run) -> None:
    while True:
        try:
            index, item = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        result = await replay_item(item, run)
        run.results[index] = result
        run.on_done(result)


async def run_replay(
    items: Sequence[DatasetItem],
    primary: Target,
    candidate: Target,
    settings: ReplaySettings = ReplaySettings(),
    *,
    semantic: SemanticScorer | None = None,
    on_done: Callable[[ItemResult], None] = lambda _result: None,
) -> list[ItemResult]:
    """Every item's result, in dataset order; a failing backend call is recorded in its
    result, never raised."""
    queue: asyncio.Queue[tuple[int, DatasetItem]] = asyncio.Queue()
    for index, item in enumerate(items):
        queue.put_nowait((index, item))
    per_item = 2 + settings.repeats
    connector = aiohttp.TCPConnector(limit=settings.concurrency * per_item)
    async with aiohttp.ClientSession(connector=connector) as session:
        run = _Run(session, primary, candidate, settings, semantic, on_done, [None] * len(items))
        workers = [_worker(queue, run) for _ in range(max(1, settings.concurrency))]
        await asyncio.gather(*workers)
    return [r for r in run.results if r is not None]
