"""The traffic a plan replays: one request per recorded turn, with its token counts.

Only counts and times matter to the simulator, so records stored with `content: none` are
enough. Two sources: the records store here (served calls, role `serve`, with their
prompt, cached and completion tokens, start time and latency), and JSONL without times
(`kvmigrate.plan.dataset`), which `pace` gives arrivals.

A conversation's prompt grows by its previous prompt, answer and new message, so its
blocks form one chain; when a prompt is shorter than the history before it (an agent
compacted or truncated its context), the chain starts again (a new `epoch`).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace

from kvmigrate.datasets import DatasetError
from kvmigrate.recorder.store import RecordStore

CHARS_PER_TOKEN = 4.0  # the usual BPE average for English text and code
DEFAULT_OUTPUT_TOKENS = 256  # a turn whose answer length is unknown


class WorkloadError(DatasetError):
    """A dataset or store that holds no replayable traffic; the message names why."""


@dataclass(frozen=True, slots=True)
class Request:
    """One turn. `arrival_s` is relative to the workload's start; `gap_s` the time between
    the previous turn's answer and this turn's arrival (the user's or agent's think time),
    None for a first turn or when the previous turn's latency is unknown."""

    conversation: str
    turn: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    chain: int  # the prefix chain (conversation and epoch) its blocks belong to
    gap_s: float | None = None
    recorded_ttft_s: float | None = None
    recorded_cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    requests: tuple[Request, ...]  # in arrival order
    source: str
    skipped: int = 0  # records without token counts
    basis_s: float = 0.0  # the time the traffic took (0: untimed); a month is priced from it
    notes: tuple[str, ...] = ()  # how the source was read, for the plan to say
    # The recording replayed: its first request's start and its last answer's end, in epoch
    # seconds, so a reader can tell a quiet Sunday from a busy Monday (None: a dataset,
    # which has no times). What-ifs (`scaled`) keep it: it says what was recorded.
    window: tuple[float, float] | None = None

    @property
    def span_s(self) -> float:
        return max((r.arrival_s for r in self.requests), default=0.0)

    @property
    def conversations(self) -> int:
        return len({r.conversation for r in self.requests})


def chain_id(conversation: str, epoch: int) -> int:
    """Stable across processes (unlike `hash` of a str), so a plan is reproducible."""
    digest = hashlib.blake2b(f"{conversation}\x00{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@dataclass(slots=True)
class Turn:
    """One turn as read from a source, before `assemble` links it into a workload."""

    conversation: str
    turn: int
    ts: float
    prompt: int
    output: int  # the answer's tokens; -1 while a dataset has not found it yet
    latency_s: float | None = None
    ttft_s: float | None = None
    cached: int | None = None


def assemble(turns: Iterable[Turn], source: str, skipped: int = 0) -> Workload:
    """Order the turns, link each conversation's chain and think times."""
    by_conversation: dict[str, list[Turn]] = defaultdict(list)
    for item in turns:
        by_conversation[item.conversation].append(item)
    if not by_conversation:
        raise WorkloadError(f"{source}: no requests with token counts to replay")
    start = min(t.ts for ts in by_conversation.values() for t in ts)
    out: list[Request] = []
    for conversation, items in by_conversation.items():
        items.sort(key=lambda x: (x.ts, x.turn))
        epoch = 0
        previous: Turn | None = None
        for t in items:
            # Shorter than the last prompt: the history was cut, so nothing before matches.
            # (Shorter than last prompt + answer is normal: reasoning is dropped from history.)
            if previous is not None and t.prompt < previous.prompt:
                epoch += 1
            gap = None
            if previous is not None and previous.latency_s is not None:
                gap = max(0.0, t.ts - previous.ts - previous.latency_s)
            out.append(
                Request(
                    conversation,
                    t.turn,
                    t.ts - start,
                    t.prompt,
                    max(1, t.output),
                    chain_id(conversation, epoch),
                    gap,
                    t.ttft_s,
                    t.cached,
                )
            )
            previous = t
    out.sort(key=lambda r: (r.arrival_s, r.conversation, r.turn))
    end = max(t.ts + (t.latency_s or 0.0) for ts in by_conversation.values() for t in ts)
    return Workload(tuple(out), source, skipped, end - start, window=(start, end))


_SELECT = (
    "SELECT conversation, turn, ts, prompt_tokens, completion_tokens, latency_ms, ttft_ms, "
    "cached_tokens FROM records WHERE ts >= ? AND ts < ? AND (status IS NULL OR status < 400) "
)
RECORDS_SQL = _SELECT + "AND role = 'serve' ORDER BY ts LIMIT ? OFFSET ?"
# What one backend served or shadowed: in a pilot the candidate gets a copy of every
# sampled conversation, so its own records are a load test of the pilot fleet.
BACKEND_SQL = (
    _SELECT + "AND backend = ? AND role IN ('serve', 'shadow') ORDER BY ts LIMIT ? OFFSET ?"
)
_PAGE = 5000


def from_store(
    store: RecordStore, since: float, until: float, backend: str | None = None
) -> Workload:
    """The served calls of the window (or, with `backend`, every call that backend
    answered, served or shadowed); a call without a prompt token count is skipped."""
    turns: list[Turn] = []
    skipped, offset = 0, 0
    sql, params = (RECORDS_SQL, ()) if backend is None else (BACKEND_SQL, (backend,))
    while True:
        page = store.query(sql, (since, until, *params, _PAGE, offset))
        for conversation, turn, ts, prompt, completion, latency, ttft, cached in page:
            if not prompt:
                skipped += 1
                continue
            turns.append(
                Turn(
                    conversation,
                    int(turn),
                    float(ts),
                    int(prompt),
                    int(completion) if completion is not None else DEFAULT_OUTPUT_TOKENS,
                    None if latency is None else latency / 1000.0,
                    None if ttft is None else ttft / 1000.0,
                    None if cached is None else int(cached),
                )
            )
        if len(page) < _PAGE:
            break
        offset += _PAGE
    return assemble(turns, store.url, skipped)


def pace(workload: Workload, conversations_per_s: float, think_s: float) -> Workload:
    """Give an untimed dataset arrivals: a new conversation every 1/rate seconds, each later
    turn `think_s` after the previous answer (the simulator waits for that answer)."""
    if conversations_per_s <= 0 or think_s < 0:
        raise ValueError("the conversation rate must be positive and the think time >= 0")
    firsts: dict[str, float] = {}
    out = []
    for r in sorted(workload.requests, key=lambda r: (r.conversation, r.turn)):
        first = r.conversation not in firsts
        start = firsts.setdefault(r.conversation, len(firsts) / conversations_per_s)
        out.append(replace(r, arrival_s=start, gap_s=None if first else think_s))
    out.sort(key=lambda r: (r.arrival_s, r.conversation, r.turn))
    return replace(workload, requests=tuple(out), basis_s=len(firsts) / conversations_per_s)


def scaled(workload: Workload, rate: float = 1.0, context: float = 1.0) -> Workload:
    """What-ifs: `rate` 2 replays the same traffic twice as fast (arrivals and think times
    halved); `context` 4 makes every prompt four times longer (cached share kept)."""
    if rate <= 0 or context <= 0:
        raise ValueError("scales must be positive")
    if rate == 1.0 and context == 1.0:
        return workload
    out = tuple(
        replace(
            r,
            arrival_s=r.arrival_s / rate,
            gap_s=None if r.gap_s is None else r.gap_s / rate,
            prompt_tokens=max(1, round(r.prompt_tokens * context)),
        )
        for r in workload.requests
    )
    return replace(workload, requests=out, basis_s=workload.basis_s / rate)
