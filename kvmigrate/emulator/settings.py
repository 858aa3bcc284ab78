"""Settings of one emulated backend: a frozen value built by the CLI or by a test."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Profile = Literal["hosted", "vllm", "anthropic"]
PROFILES: tuple[Profile, ...] = ("hosted", "vllm", "anthropic")


@dataclass(frozen=True, slots=True)
class LatencySettings:
    """The timing model of one backend, before `time_scale` applies.

    TTFT = `ttft_base_s` + uniform(0, `ttft_jitter_s`)
           + (uncached prompt tokens + `cached_token_cost` * cached tokens) / `prefill_tokens_per_s`
           + time queued behind other prefills (at most `engine_concurrency` run at once, FIFO).
    After the first token every further token takes 1 / `decode_tokens_per_s` seconds.

    ttft_base_s: fixed cost of a request before prefill (scheduling, network, tokenizing).
    ttft_jitter_s: upper bound of a uniform random addition to the base, for a busy API's spread.
    prefill_tokens_per_s: prefill throughput for uncached prompt tokens.
    cached_token_cost: the work a cached prompt token still costs, as a share of an uncached one
        (attention over the cached history is not free).
    decode_tokens_per_s: decode speed of one stream; sets the gap between streamed tokens.
    engine_concurrency: how many prefills run at once; the rest wait in FIFO order.
    """

    ttft_base_s: float
    ttft_jitter_s: float
    prefill_tokens_per_s: float
    cached_token_cost: float
    decode_tokens_per_s: float
    engine_concurrency: int

    @classmethod
    def vllm(cls) -> LatencySettings:
        """Llama-3.1-8B on one H200: 327 ms for a 10,150-token cold prefill, and about 50 ms
        for 700 new tokens on top of a cached 9,450-token history."""
        return cls(
            ttft_base_s=0.015,
            ttft_jitter_s=0.0,
            prefill_tokens_per_s=32_500.0,
            cached_token_cost=0.045,
            decode_tokens_per_s=150.0,
            engine_concurrency=4,
        )

    @classmethod
    def hosted(cls) -> LatencySettings:
        """A busy hosted API: a slow, noisy start, slower prefill, discounted cached prefix."""
        return cls(
            ttft_base_s=0.35,
            ttft_jitter_s=0.15,
            prefill_tokens_per_s=12_000.0,
            cached_token_cost=0.25,
            decode_tokens_per_s=75.0,
            engine_concurrency=64,
        )

    @classmethod
    def for_profile(cls, profile: Profile) -> LatencySettings:
        return cls.vllm() if profile == "vllm" else cls.hosted()


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Faults injected at random, each a probability per request (0 disables it).

    error_rate: answer 500 in the profile's error envelope.
    rate_limit_rate: answer 429 with a `Retry-After` header.
    disconnect_rate: close the connection mid-stream (or mid-body when not streamed).
    stall_rate: stop mid-stream for `stall_s` seconds.
    malformed_rate: send invalid JSON (non-streamed) or garbage SSE lines (streamed).
    slow_first_byte_s: delay every response's first byte by this many seconds.
    stall_s: how long a random stall lasts.
    """

    error_rate: float = 0.0
    rate_limit_rate: float = 0.0
    disconnect_rate: float = 0.0
    stall_rate: float = 0.0
    malformed_rate: float = 0.0
    slow_first_byte_s: float = 0.0
    stall_s: float = 5.0


def _default_models(profile: Profile) -> tuple[str, ...]:
    if profile == "hosted":
        return ("gpt-4o-mini", "text-embedding-3-small")
    if profile == "anthropic":
        return ("claude-sonnet-4-5",)
    return ("meta-llama/Llama-3.1-8B-Instruct",)


@dataclass(frozen=True, slots=True)
class EmulatorSettings:
    """Everything one emulated backend does differently; zero or empty means the profile's default.

    profile: `hosted` (OpenAI's wire format and prompt-caching rule), `vllm` (vLLM's wire
        format, a block prefix cache and Prometheus metrics; also its /v1/messages), or
        `anthropic` (Anthropic's Messages API only, with `cache_control` breakpoints).
    name: this instance's name, which `x-emulator-fault` targets select; default the profile.
    models: served model names; default `gpt-4o-mini` and `text-embedding-3-small` (hosted)
        or `meta-llama/Llama-3.1-8B-Instruct` (vllm). Other names get a 404.
    api_key: when set, requests need `Authorization: Bearer <api_key>`, else 401.
    max_model_len: context window; prompt plus requested output beyond it is a 400.
        Default 128,000 (hosted), 131,072 (vllm) or 200,000 (anthropic).
    max_output_tokens: hosted only: the largest `max_tokens` accepted (OpenAI's 16,384).
    time_scale: multiplies every delay; 0 answers at once, 1 is real time.
    latency: the timing model; default `LatencySettings.for_profile(profile)`.
    block_size: vllm prefix cache block size in tokens; only whole blocks are cached.
    cache_capacity_tokens: prefix cache capacity in tokens, evicted least recently used.
    hosted_cache_ttl_s: hosted and anthropic: how long an unused cached prefix survives
        (Anthropic's default is 5 minutes, refreshed on each hit).
    cache_min_tokens: anthropic only: the shortest prefix a breakpoint caches (1,024 for
        the Sonnet models).
    prompt_tokens_details: vllm only: report `usage.prompt_tokens_details` (as vLLM with
        `--enable-prompt-tokens-details`); otherwise it is null.
    noise: 0..1, the share of word choices that vary between two unseeded calls (scaled by
        the request's temperature); a request `seed` makes the variation reproducible.
    min_output_tokens, max_output_tokens_default: the range of a free-text answer's length
        when the request does not cut it shorter.
    embedding_dimensions: default embedding vector length.
    faults: random fault injection rates.
    azure: hosted only: also serve Azure OpenAI's URL shape,
        /openai/deployments/{deployment}/chat/completions?api-version=..., with the
        `api-key` header; deployments are the served model names.
    answer_family: emulators with the same family answer a prompt alike (up to `noise`),
        as a candidate that matches the primary would; empty: each profile and model
        answers in its own way, as two different models do.
    broken_tool_calls: 0..1, the share of tool-calling answers whose calls come out broken
        (a wrong tool name, arguments cut mid-JSON), as from a misconfigured tool parser.
    fault_seed: seeds the random draws of faults and latency jitter; 0 draws from the OS.
    responses_store: keep Responses API answers so `previous_response_id` continues them
        (OpenAI always does; vLLM only with `VLLM_ENABLE_RESPONSES_API_STORE=1`).
    """

    profile: Profile = "vllm"
    name: str = ""
    models: tuple[str, ...] = ()
    api_key: str | None = None
    max_model_len: int = 0
    max_output_tokens: int = 16_384
    time_scale: float = 1.0
    latency: LatencySettings | None = None
    block_size: int = 16
    cache_capacity_tokens: int = 2_000_000
    hosted_cache_ttl_s: float = 600.0
    cache_min_tokens: int = 1024
    prompt_tokens_details: bool = True
    noise: float = 0.15
    min_output_tokens: int = 20
    max_output_tokens_default: int = 60
    embedding_dimensions: int = 1536
    faults: FaultRates = field(default_factory=FaultRates)
    broken_tool_calls: float = 0.0
    answer_family: str = ""
    azure: bool = False
    fault_seed: int = 0
    responses_store: bool = True

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, not {self.profile!r}")
        if self.time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError("noise must be between 0 and 1")
        if self.block_size < 1 or self.cache_capacity_tokens < 0:
            raise ValueError("block_size must be >= 1 and cache_capacity_tokens >= 0")
        if not 0 < self.min_output_tokens <= self.max_output_tokens_default:
            raise ValueError("need 0 < min_output_tokens <= max_output_tokens_default")

    @property
    def instance_name(self) -> str:
        return self.name or self.profile

    @property
    def served_models(self) -> tuple[str, ...]:
        return self.models or _default_models(self.profile)

    @property
    def context_limit(self) -> int:
        if self.max_model_len:
            return self.max_model_len
        return {"hosted": 128_000, "anthropic": 200_000}.get(self.profile, 131_072)

    @property
    def latency_settings(self) -> LatencySettings:
        return self.latency or LatencySettings.for_profile(self.profile)


def latency_for(
    profile: Profile,
    *,
    ttft_base_s: float | None = None,
    ttft_jitter_s: float | None = None,
    prefill_tokens_per_s: float | None = None,
    cached_token_cost: float | None = None,
    decode_tokens_per_s: float | None = None,
    engine_concurrency: int | None = None,
) -> LatencySettings:
    """The profile's latency model with the given knobs replaced; None keeps the default."""
    base = LatencySettings.for_profile(profile)

    def pick(value: float | None, default: float) -> float:
        return default if value is None else value

    return LatencySettings(
        ttft_base_s=pick(ttft_base_s, base.ttft_base_s),
        ttft_jitter_s=pick(ttft_jitter_s, base.ttft_jitter_s),
        prefill_tokens_per_s=pick(prefill_tokens_per_s, base.prefill_tokens_per_s),
        cached_token_cost=pick(cached_token_cost, base.cached_token_cost),
        decode_tokens_per_s=pick(decode_tokens_per_s, base.decode_tokens_per_s),
        engine_concurrency=engine_concurrency or base.engine_concurrency,
    )
