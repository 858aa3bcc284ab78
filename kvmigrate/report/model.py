"""The report as plain data: what the aggregation computes and every renderer reads.

Every figure that may be missing (no records, no usage, no candidate traffic) is None,
never NaN: renderers show "—" and JSON shows null."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvmigrate.report.completeness import Completeness
from kvmigrate.report.evaluate import SlowConversations
from kvmigrate.report.identity import IdentitySummary
from kvmigrate.report.scorecard_model import ScorecardRow
from kvmigrate.report.users import UsersFigures

if TYPE_CHECKING:
    from kvmigrate.report.cost_per_token import CostFigures
    from kvmigrate.report.gpu import GpuFigures


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One step of the rollout (a mode or percent change, a rollback, a gate verdict).

    The report takes a list of these from the caller: `kvmigrate report` fills it from the
    rollout store once that exposes its audit trail."""

    ts: float
    kind: str  # e.g. "shadow", "split", "promote", "rollback", "gate"
    detail: str = ""
    percent: float | None = None  # the candidate's share of conversations after the event
    cohort: str = ""  # the cohort it changed; "": the fleet-wide default every cohort follows


# Anthropic bills a 5-minute cache write at 1.25 times the base input price (1-hour: 2x).
CACHE_WRITE_MULTIPLIER = 1.25


@dataclass(frozen=True, slots=True)
class Prices:
    """Hosted prices in $ per 1M tokens, against self-hosted GPUs in $ per GPU-hour.

    `gpu_tokens_per_s` is the output tokens per second one GPU sustains for this traffic
    (from `kvmigrate bench`); None uses the candidate's observed peak rate, which only
    bounds the capacity from below and so overstates the GPUs needed.

    `cache_write_per_m` prices prompt tokens written to the cache, which only Anthropic
    reports and bills apart (`cache_creation_input_tokens`); None takes Anthropic's rate
    for the 5-minute cache, `CACHE_WRITE_MULTIPLIER` times `input_per_m`. For Anthropic
    traffic set `cached_input_per_m` to its cache-read price (0.1 x input)."""

    input_per_m: float = 2.50
    cached_input_per_m: float = 1.25
    output_per_m: float = 10.00
    gpu_per_hour: float = 3.50
    gpu_tokens_per_s: float | None = None
    min_gpus: int = 1
    cache_write_per_m: float | None = None

    @property
    def cache_write_price(self) -> float:
        if self.cache_write_per_m is not None:
            return self.cache_write_per_m
        return self.input_per_m * CACHE_WRITE_MULTIPLIER


@dataclass(slots=True)
class BackendSummary:
    backend: str
    serve: int = 0
    shadow: int = 0
    conversations: int = 0
    errors: int = 0
    error_rate: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    # The timed calls behind the TTFT figures, and the 95% distribution-free interval of
    # each (None: unbounded with so few), for the scorecard.
    ttft_n: int = 0
    ttft_p50_low_ms: float | None = None
    ttft_p50_high_ms: float | None = None
    ttft_p95_low_ms: float | None = None
    ttft_p95_high_ms: float | None = None
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def requests(self) -> int:
        return self.serve + self.shadow


@dataclass(frozen=True, slots=True)
class TurnRow:
    """TTFT at one turn number: primary against candidate (ms), and the candidate's gain."""

    turn: str  # "1", "2", ... and "N+" for the last, open-ended bucket
    primary_n: int
    primary_p50_ms: float | None
    primary_p95_ms: float | None
    candidate_n: int
    candidate_p50_ms: float | None
    candidate_p95_ms: float | None
    reduction_p50_pct: float | None  # (primary - candidate) / primary; > 0: candidate faster
    reduction_p95_pct: float | None


@dataclass(frozen=True, slots=True)
class DecodeSummary:
    """Decode speed of one backend's streamed answers (kvmigrate.report.decode): output
    tokens per second after the first token per stream, with the 95% distribution-free
    interval of its median; time per output token; and the gaps between relayed chunks
    (each stream's mean gap, and its longest). `no_usage`: streamed answers that could not
    count, having no usage (the client did not ask for `stream_options.include_usage`)."""

    backend: str
    streams: int = 0
    no_usage: int = 0
    tps_p50: float | None = None
    tps_p50_low: float | None = None
    tps_p50_high: float | None = None
    tps_p10: float | None = None  # the slow tail: nine streams in ten decode faster
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    gap_p50_ms: float | None = None
    gap_max_p95_ms: float | None = None


@dataclass(frozen=True, slots=True)
class DecodeDifference:
    """The candidate's median tokens per second per stream minus the primary's, with a 95%
    interval built from the two medians' own (Newcombe's MOVER construction)."""

    primary: float | None = None
    candidate: float | None = None
    difference: float | None = None
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True, slots=True)
class DecodeTurnRow:
    """Decode speed at one turn number: median tokens per second and time per output token."""

    turn: str
    primary_n: int
    primary_tps_p50: float | None
    primary_tpot_p50_ms: float | None
    candidate_n: int
    candidate_tps_p50: float | None
    candidate_tpot_p50_ms: float | None


@dataclass(frozen=True, slots=True)
class Flatness:
    """Whether one backend's TTFT stays flat as conversations grow (kvmigrate.report.flatness):
    the OLS slope of TTFT on the turn number, in ms per turn, with a 95% interval whose
    standard error is cluster-robust by conversation (turns of one conversation are not
    independent); and TTFT from turn `late_turn` on, the playbook's "past 10 turns", with
    the distribution-free 95% interval of its p95."""

    backend: str
    calls: int = 0
    conversations: int = 0
    slope_ms_per_turn: float | None = None
    slope_low: float | None = None
    slope_high: float | None = None
    late_turn: int = 10
    late_n: int = 0
    late_p50_ms: float | None = None
    late_p95_ms: float | None = None
    late_p95_low: float | None = None
    late_p95_high: float | None = None


@dataclass(frozen=True, slots=True)
class CacheRow:
    """cached / prompt tokens at one turn number, per backend (None: no usage reported)."""

    turn: str
    hit: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class Coverage:
    """How much of the primary's served traffic the candidate also saw as shadow copies."""

    primary_requests: int = 0
    shadowed_requests: int = 0
    request_ratio: float | None = None
    primary_conversations: int = 0
    shadowed_conversations: int = 0
    conversation_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class CostProjection:
    basis_s: float = 0.0  # the traffic span the monthly figures scale from
    monthly_requests: float | None = None
    monthly_input_tokens: float | None = None
    monthly_cached_tokens: float | None = None
    monthly_cache_write_tokens: float | None = None
    monthly_output_tokens: float | None = None
    hosted_monthly_usd: float | None = None
    demand_tokens_per_s: float | None = None
    gpu_tokens_per_s: float | None = None
    throughput_source: str = ""
    gpus: int | None = None
    self_hosted_monthly_usd: float | None = None
    savings_monthly_usd: float | None = None
    prices: Prices = field(default_factory=Prices)


@dataclass(frozen=True, slots=True)
class Divergence:
    request_id: str
    conversation: str
    turn: int
    score: float
    excerpt: str


@dataclass(frozen=True, slots=True)
class DivergentPair:
    """A shadow pair whose answers differ, for the divergences view: the comparators that
    disagreed beyond this request's noise (`diverged_on`) and within it (`within_noise`:
    the primary's own repeat disagreed there too), and both answers as stored (redacted
    unless `record.content: full`). `cohort` when the records carry one."""

    request_id: str
    conversation: str
    turn: int
    score: float
    verdict: str  # "diverged" or "within_noise"
    diverged_on: tuple[str, ...]
    within_noise: tuple[str, ...]
    primary: str
    candidate: str
    cohort: str | None = None
    backend: str = ""  # the candidate that answered, when a model shadows to several


@dataclass(frozen=True, slots=True)
class BusterRow:
    cls: str
    field: str
    label: str
    breaks: int
    conversations: int
    tokens_lost: int
    deliberate: bool
    fix: str


@dataclass(frozen=True, slots=True)
class CacheBusters:
    """`checked` False: no request bodies recorded (record.content none) to look at."""

    checked: bool = False
    conversations: int = 0
    compared: int = 0  # requests after their conversation's first
    reuse_ratio: float | None = None
    breaks: int = 0  # not counting deliberate history truncation
    tokens_lost: int = 0
    busters: tuple[BusterRow, ...] = ()


@dataclass(frozen=True, slots=True)
class ParitySummary:
    scored: bool = False  # False until the parity engine adds its columns and scores pairs
    samples: int = 0
    mean: float | None = None
    tool_agreement: float | None = None
    json_validity: float | None = None
    histogram: tuple[int, ...] = ()  # counts of scores in ten bins over [0, 1]
    worst: tuple[Divergence, ...] = ()
    noise_adjusted: float | None = None  # None while too few noise pairs are in
    noise_pairs: int = 0
    lowest_comparator: str | None = None  # the comparator `noise_adjusted` is the parity of


@dataclass(frozen=True, slots=True)
class CandidatePair:
    """Two candidates' answers to the same shadowed requests, against each other
    (kvmigrate.report.candidate_pairs): `a` and `b` in name order. `agreement` is the share
    of `compared` requests where every comparator agreed both ways, with its Wilson
    interval; `disagreed` counts the requests each comparator disagreed on."""

    a: str
    b: str
    requests: int = 0  # requests both answered (their shadow copies share the primary's id)
    compared: int = 0  # of those, with both answers stored (record.content not none)
    agreed: int = 0
    agreement: float | None = None
    agreement_low: float | None = None
    agreement_high: float | None = None
    disagreed: dict[str, int] = field(default_factory=dict)  # most first
    a_latency_p50_ms: float | None = None
    b_latency_p50_ms: float | None = None
    a_ttft_p50_ms: float | None = None
    b_ttft_p50_ms: float | None = None
    a_prompt_tokens: int = 0
    b_prompt_tokens: int = 0
    a_cached_tokens: int = 0
    b_cached_tokens: int = 0


@dataclass(slots=True)
class Report:
    generated_at: float
    since: float
    until: float
    database: str
    primary: str
    candidate: str
    records: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    backends: list[BackendSummary] = field(default_factory=list)
    coverage: Coverage = field(default_factory=Coverage)
    ttft_by_turn: list[TurnRow] = field(default_factory=list)
    cache_by_turn: list[CacheRow] = field(default_factory=list)
    latency_cdf: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    cost: CostProjection = field(default_factory=CostProjection)
    parity: ParitySummary = field(default_factory=ParitySummary)
    cache_busters: CacheBusters = field(default_factory=CacheBusters)
    noise_calls: int = 0  # the primary asked twice for parity: in `records`, not in figures
    timeline: list[TimelineEvent] = field(default_factory=list)
    identity: IdentitySummary = field(default_factory=IdentitySummary)
    divergences: list[DivergentPair] = field(default_factory=list)
    divergent_total: int = 0  # all divergent pairs in the window; `divergences` holds the worst
    notes: list[str] = field(default_factory=list)
    # Each cohort's own report (every section on its traffic alone), under this fleet-wide
    # one; empty when the traffic is one cohort. "" here: the fleet.
    cohort: str = ""
    cohorts: list[Report] = field(default_factory=list)
    # Parity per candidate backend, when several were shadowed (models[].candidates).
    parity_by_candidate: dict[str, ParitySummary] = field(default_factory=dict)
    # Candidates against each other on the requests both were shadowed.
    candidate_pairs: list[CandidatePair] = field(default_factory=list)
    # The answers the proxies counted against the records (fleet-wide only).
    completeness: Completeness = field(default_factory=Completeness)
    # Whether users stay, by arm (report.users); None before it is computed.
    users: UsersFigures | None = None
    # The slowest conversations of 5+ turns, their cost and what prefix caching would save.
    slow_conversations: SlowConversations = field(default_factory=SlowConversations)
    # The candidates' GPU and KV use and each arm's cost per token (report.engine_use),
    # fleet-wide only; None when the report was built without the config's scrape setup.
    gpu: GpuFigures | None = None
    cost_per_token: CostFigures | None = None
    # Decode speed per backend, the candidate's against the primary's, and by turn.
    decode: list[DecodeSummary] = field(default_factory=list)
    decode_difference: DecodeDifference = field(default_factory=DecodeDifference)
    decode_by_turn: list[DecodeTurnRow] = field(default_factory=list)
    # TTFT's slope across turns per backend (the primary's and the candidate's).
    flatness: list[Flatness] = field(default_factory=list)
    # The playbook's checklist (kvmigrate.report.scorecard), fleet-wide only.
    scorecard: list[ScorecardRow] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.records == 0
