"""`kvmigrate emulate`: serve an emulated OpenAI-compatible backend."""

from __future__ import annotations

import click

from kvmigrate.cli.options import FiniteRange, prefer_env
from kvmigrate.emulator import (
    PROFILES,
    EmulatorSettings,
    FaultRates,
    Profile,
    latency_for,
    serve,
)

_RATE = FiniteRange(0.0, 1.0)
_SECONDS = FiniteRange(min=0.0)


@click.command(context_settings={"show_default": True})
@click.option(
    "--profile",
    type=click.Choice(PROFILES),
    required=True,
    help="hosted: OpenAI's wire format and prompt caching. vllm: vLLM's wire format, "
    "block prefix cache and Prometheus metrics.",
)
@click.option("--host", default="127.0.0.1", help="Interface to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, help="Port to listen on.")
@click.option(
    "--name",
    default="",
    show_default=False,
    help="Instance name that x-emulator-fault targets match [default: the profile].",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    help="Served model name (repeatable) "
    "[default: gpt-4o-mini and text-embedding-3-small, or "
    "meta-llama/Llama-3.1-8B-Instruct].",
)
@click.option(
    "--api-key",
    envvar="KVMIGRATE_EMULATOR_API_KEY",
    default=None,
    help="Require `Authorization: Bearer KEY` on /v1. " + prefer_env("KVMIGRATE_EMULATOR_API_KEY"),
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=0),
    default=0,
    show_default=False,
    help="Context window; longer requests get a 400 [default: 128000 hosted, 131072 vllm].",
)
@click.option(
    "--time-scale",
    type=_SECONDS,
    default=1.0,
    help="Multiplies every delay: 0 answers at once, 1 is real time.",
)
@click.option(
    "--ttft-base",
    type=_SECONDS,
    help="Seconds before prefill starts [default: 0.35 hosted, 0.015 vllm].",
)
@click.option(
    "--ttft-jitter",
    type=_SECONDS,
    help="Upper bound of a uniform random addition to the base [default: 0.15 hosted, 0 vllm].",
)
@click.option(
    "--prefill-rate",
    type=FiniteRange(min=1.0),
    help="Prefill tokens per second for uncached tokens [default: 12000 hosted, 32500 vllm].",
)
@click.option(
    "--cached-cost",
    type=_RATE,
    help="Work of a cached prompt token as a share "
    "of an uncached one [default: 0.25 hosted, 0.045 vllm].",
)
@click.option(
    "--decode-rate",
    type=FiniteRange(min=0.1),
    help="Decode tokens per second of one stream [default: 75 hosted, 150 vllm].",
)
@click.option(
    "--engine-concurrency",
    type=click.IntRange(min=1),
    help="Prefills run at once; the rest queue FIFO [default: 64 hosted, 4 vllm].",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=16,
    help="vllm prefix cache block size in tokens.",
)
@click.option(
    "--cache-capacity",
    type=click.IntRange(min=0),
    default=2_000_000,
    help="Prefix cache capacity in tokens (LRU).",
)
@click.option(
    "--hosted-cache-ttl",
    type=_SECONDS,
    default=600.0,
    help="hosted, anthropic: seconds an unused cached prefix survives.",
)
@click.option(
    "--cache-min-tokens",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="anthropic: the shortest prefix a cache_control breakpoint caches.",
)
@click.option(
    "--no-prompt-tokens-details",
    is_flag=True,
    help="vllm: report "
    "usage.prompt_tokens_details as null, like vLLM without "
    "--enable-prompt-tokens-details.",
)
@click.option(
    "--noise",
    type=_RATE,
    default=0.15,
    help="Share of word choices that vary between unseeded calls (times the request temperature).",
)
@click.option(
    "--azure",
    is_flag=True,
    help="hosted: also serve Azure OpenAI's URL shape (/openai/deployments/{deployment}/..."
    "?api-version=..., `api-key` header).",
)
@click.option(
    "--answer-family",
    default="",
    help="Emulators with the same family answer a prompt alike, up to --noise (a candidate "
    "matching the primary); default: each profile and model answers its own way.",
)
@click.option(
    "--broken-tool-calls",
    type=_RATE,
    default=0.0,
    help="Share of tool-calling answers whose calls come out broken (wrong name, cut JSON), "
    "as from a misconfigured tool parser.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=False,
    help="Seed for random faults and latency jitter (0: from the OS).",
)
@click.option("--error-rate", type=_RATE, default=0.0, help="Share of requests answered 500.")
@click.option(
    "--rate-limit-rate",
    type=_RATE,
    default=0.0,
    help="Share of requests answered 429 with Retry-After.",
)
@click.option(
    "--disconnect-rate",
    type=_RATE,
    default=0.0,
    help="Share of requests whose connection closes mid-response.",
)
@click.option(
    "--stall-rate",
    type=_RATE,
    default=0.0,
    help="Share of requests that stall mid-response for --stall-seconds.",
)
@click.option("--stall-seconds", type=_SECONDS, default=5.0, help="Length of a random stall.")
@click.option(
    "--malformed-rate",
    type=_RATE,
    default=0.0,
    help="Share of requests answered with invalid JSON or garbage SSE lines.",
)
@click.option(
    "--slow-first-byte",
    type=_SECONDS,
    default=0.0,
    help="Delay every response's first byte by this many seconds.",
)
def emulate(
    profile: Profile,
    host: str,
    port: int,
    name: str,
    models: tuple[str, ...],
    api_key: str | None,
    max_model_len: int,
    time_scale: float,
    ttft_base: float | None,
    ttft_jitter: float | None,
    prefill_rate: float | None,
    cached_cost: float | None,
    decode_rate: float | None,
    engine_concurrency: int | None,
    block_size: int,
    cache_capacity: int,
    hosted_cache_ttl: float,
    cache_min_tokens: int,
    no_prompt_tokens_details: bool,
    noise: float,
    azure: bool,
    answer_family: str,
    broken_tool_calls: float,
    seed: int,
    error_rate: float,
    rate_limit_rate: float,
    disconnect_rate: float,
    stall_rate: float,
    stall_seconds: float,
    malformed_rate: float,
    slow_first_byte: float,
) -> None:
    """Serve an emulated backend: OpenAI's hosted API, vLLM, or Anthropic's API.

    Endpoints: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
    /v1/messages (Anthropic's Messages API, as vLLM serves it too), /v1/models, /health,
    /metrics; the anthropic profile serves /v1/messages (and count_tokens) and /v1/models.
    Answers are deterministic for a prompt and seed, relate to the prompt, and vary with
    --noise between unseeded calls; the header `x-emulator-noise-seed: N` (a whole number)
    seeds that variation, so a test bed can replay unseeded chat and completion calls.

    \b
    Latency: TTFT = base + jitter + (uncached + cached-cost * cached) / prefill-rate,
    plus FIFO queueing behind --engine-concurrency prefills; then one token per
    1/decode-rate seconds; all times --time-scale.

    \b
    Aim faults at one request with the header
      x-emulator-fault: [target:]fault[=arg], ...
    where target (optional) must equal --name, and fault is one of
      500 | 503 | any 4xx/5xx | 429[=retry-after] | slow-first-byte=S | stall[=S] |
      disconnect | malformed-json | malformed-sse | redirect | wrong-framing |
      no-line-ends | hang
    """
    latency = latency_for(
        profile,
        ttft_base_s=ttft_base,
        ttft_jitter_s=ttft_jitter,
        prefill_tokens_per_s=prefill_rate,
        cached_token_cost=cached_cost,
        decode_tokens_per_s=decode_rate,
        engine_concurrency=engine_concurrency,
    )
    faults = FaultRates(
        error_rate=error_rate,
        rate_limit_rate=rate_limit_rate,
        disconnect_rate=disconnect_rate,
        stall_rate=stall_rate,
        malformed_rate=malformed_rate,
        slow_first_byte_s=slow_first_byte,
        stall_s=stall_seconds,
    )
    settings = EmulatorSettings(
        profile=profile,
        name=name,
        models=models,
        api_key=api_key,
        max_model_len=max_model_len,
        time_scale=time_scale,
        latency=latency,
        block_size=block_size,
        cache_capacity_tokens=cache_capacity,
        hosted_cache_ttl_s=hosted_cache_ttl,
        cache_min_tokens=cache_min_tokens,
        prompt_tokens_details=not no_prompt_tokens_details,
        noise=noise,
        broken_tool_calls=broken_tool_calls,
        answer_family=answer_family,
        azure=azure,
        faults=faults,
        fault_seed=seed,
    )
    try:
        serve(settings, host, port)
    except OSError as exc:  # the port taken, the host unknown or not this machine's
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None
