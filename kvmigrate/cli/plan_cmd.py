"""`kvmigrate plan`: how many vLLM replicas the recorded traffic needs, at what TTFT and cost."""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import click

from kvmigrate.cli.options import (
    BaseURL,
    FiniteRange,
    OutputPath,
    config_option,
    load_or_exit,
    prefer_env,
    write_output,
)
from kvmigrate.cli.report_cmd import open_records, parse_since
from kvmigrate.config import safe_url
from kvmigrate.datasets import DatasetError
from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.dataset import MAX_OUTPUT_TOKENS, from_jsonl
from kvmigrate.plan.hardware import GPUS, MODELS, HardwareError, Replica, lookup
from kvmigrate.plan.refine import refine
from kvmigrate.plan.routing import ROUTINGS
from kvmigrate.plan.scheduler import EngineSettings
from kvmigrate.plan.simulate import Fleet
from kvmigrate.plan.speed import scaled_cost, speed_note
from kvmigrate.plan.sweep import Costs, Plan, hosted_monthly, parse_sizes, sweep
from kvmigrate.plan.workload import Workload, from_store, pace, scaled
from kvmigrate.report.model import Prices

_POSITIVE = click.IntRange(min=1)
_SCALE = FiniteRange(min=0.01)
_PRICE = FiniteRange(min=0)


def _workload(
    dataset: Path | None,
    records: str | None,
    config_path: str,
    since: str,
    pacing: tuple[float, float],
    backend: str | None = None,
    output_tokens: int | None = None,
) -> Workload:
    try:
        if dataset is not None:
            loaded = from_jsonl(dataset, output_tokens)
            return pace(loaded, *pacing)
        # The plan calls no backend: the proxy's secrets need not be set (as for report).
        url = records or load_or_exit(config_path, secrets_required=False).record.db
        with ExitStack() as stack:
            store = open_records(url)
            if store is None:
                where = safe_url(url)
                raise click.ClickException(f"no records database at {where}; record traffic first")
            stack.enter_context(store)
            now = time.time()
            return from_store(store, parse_since(since, now), now + 1.0, backend)
    except DatasetError as exc:  # WorkloadError too; a dataset file's own errors
        raise click.ClickException(str(exc)) from None


def _replica(o: _Options) -> Replica:
    try:
        chosen = lookup(MODELS, o.model_name, "model")
        if o.weights_gb is not None:
            chosen = replace(chosen, weights_gb=o.weights_gb)
        gpu = lookup(GPUS, o.gpu, "GPU")
    except HardwareError as exc:
        raise click.ClickException(str(exc)) from None
    return Replica(gpu, chosen, o.gpus_per_replica, o.gpu_memory_utilization, o.kv_bytes_per_token)


def _kv_blocks(o: _Options, replica: Replica) -> int:
    if o.kv_blocks is not None:
        return o.kv_blocks
    try:
        return replica.kv_blocks(o.block_size)
    except HardwareError as exc:
        raise click.ClickException(str(exc)) from None


def _cost_model(
    cost_model: Path | None,
    calibrate: str | None,
    api_key: str | None,
    model: str | None,
    lengths: str,
) -> CostModel:
    if calibrate:
        from kvmigrate.bench import Target
        from kvmigrate.plan.calibrate import calibrate as run_calibration

        try:
            sizes = [int(x) for x in lengths.split(",") if x.strip()]
            target = Target(calibrate.rstrip("/"), model, api_key or "EMPTY", calibrate)
            fitted, probes = run_calibration(target, sizes)
        except (ValueError, RuntimeError) as exc:  # CalibrationError is a RuntimeError
            raise click.ClickException(f"calibration failed: {exc}") from None
        problem = fitted.problem()
        if problem is not None:
            raise click.ClickException(
                f"calibration failed: the fit's {problem}; the endpoint's timings were too "
                "noisy to separate: retry on a quiet server, or with longer --calibrate-lengths"
            )
        click.echo(f"calibrated on {len(probes)} probes against {calibrate}", err=True)
        return fitted
    if cost_model is not None:
        try:
            return CostModel.load(cost_model)
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            raise click.ClickException(f"{cost_model}: {exc}") from None
    return CostModel()


def _notes(
    dataset: Path | None, rate: float, think: float, rate_scale: float, context_scale: float
) -> tuple[str, ...]:
    notes = []
    if dataset is not None:
        notes.append(
            f"Untimed dataset: a new conversation every {1 / rate:g} s, each turn "
            f"{think:g} s after the previous answer; prompt tokens not recorded in it are "
            "counted at ~4 characters each (tool definitions included)."
        )
    if rate_scale != 1.0:
        notes.append(f"What if: traffic {rate_scale:g}x as fast as recorded.")
    if context_scale != 1.0:
        notes.append(f"What if: every prompt {context_scale:g}x as long as recorded.")
    return tuple(notes)


def _emit(plan: Plan, as_json: bool, html_path: Path | None) -> None:
    from kvmigrate.plan.render import plan_json, render_text

    if html_path is not None:
        from kvmigrate.plan.html import render_html

        write_output(html_path, render_html(plan))
    if as_json:
        click.echo(json.dumps(plan_json(plan), indent=2))
    else:
        click.echo(render_text(plan))
        if html_path is not None:
            click.echo(f"chart: {html_path}")


@click.command(context_settings={"show_default": True})
@config_option
@click.option("--records", help="Records database URL [default: the config's record.db].")
@click.option("--since", default="7d", help="Recorded traffic to replay: 24h, 7d, all, or a date.")
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSONL instead of the records: `kvmigrate report --export-requests` output "
    "or bench conversations (OpenAI messages or ShareGPT).",
)
@click.option(
    "--conversation-rate",
    type=_SCALE,
    default=1.0,
    help="New conversations per second, for a --dataset without times.",
)
@click.option(
    "--output-tokens",
    type=click.IntRange(1, MAX_OUTPUT_TOKENS),
    help="Answer length for --dataset turns whose answer is not recorded "
    "[default: the median recorded answer, else 256]; never a request's max_tokens.",
)
@click.option(
    "--think-time",
    type=FiniteRange(min=0),
    default=5.0,
    help="Seconds between an answer and the next turn, for a --dataset.",
)
@click.option("--replicas", default="1..8", help="Fleet sizes: 4, 1..16, 1,2,4,8 or 2..16/2.")
@click.option(
    "--gpu",
    default="h200",
    help=f"GPU: {', '.join(GPUS)}. Sets the KV cache, and the speed unless calibrated.",
)
@click.option("--model", "model_name", default="llama-3.1-8b", help=f"Model: {', '.join(MODELS)}.")
@click.option("--gpus-per-replica", type=_POSITIVE, default=1, help="Tensor-parallel GPUs.")
@click.option("--weights-gb", type=FiniteRange(min=0), help="Override the model's weights.")
@click.option("--kv-bytes-per-token", type=_POSITIVE, help="Override the model's KV bytes/token.")
@click.option(
    "--gpu-memory-utilization",
    type=FiniteRange(0.05, 1.0),
    default=0.9,
    help="vLLM's --gpu-memory-utilization.",
)
@click.option("--kv-blocks", type=_POSITIVE, help="KV blocks per replica, instead of GPU/model.")
@click.option("--block-size", type=_POSITIVE, default=16, help="Tokens per KV block.")
@click.option("--max-batched-tokens", type=_POSITIVE, default=8192, help="Token budget per step.")
@click.option("--max-seqs", type=_POSITIVE, default=256, help="Sequences per step at most.")
@click.option(
    "--routing",
    type=click.Choice(ROUTINGS),
    default="affinity",
    help="affinity: kvmigrate's bounded-load hashing per conversation.",
)
@click.option("--no-prefix-caching", is_flag=True, help="What if: vLLM without prefix caching.")
@click.option("--rate-scale", type=_SCALE, default=1.0, help="What if: traffic this much faster.")
@click.option(
    "--context-scale",
    type=_SCALE,
    default=1.0,
    help="What if: every prompt this much longer (4 takes 8K contexts to 32K).",
)
@click.option(
    "--ttft-p95-slo",
    type=FiniteRange(min=0),
    default=1000.0,
    help="TTFT p95 target in ms; exit 1 when no fleet size meets it.",
)
@click.option(
    "--headroom",
    type=FiniteRange(0, 400),
    default=25.0,
    help="Percent to buy above the smallest fleet meeting the SLO (25: run at <= 80%).",
)
@click.option("--gpu-hour-price", type=FiniteRange(min=0), default=3.50, help="$ per GPU-hour.")
@click.option("--input-price", type=_PRICE, default=2.50, help="Hosted $ per 1M input tokens.")
@click.option("--cached-input-price", type=_PRICE, default=1.25,
              help="Hosted $ per 1M cached input tokens.")  # fmt: skip
@click.option("--output-price", type=_PRICE, default=10.00, help="Hosted $ per 1M output tokens.")
@click.option(
    "--cost-model",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cost model JSON (from --save-cost-model) [default: 8B on one H200].",
)
@click.option(
    "--calibrate",
    "calibrate_url",
    type=BaseURL(),
    metavar="URL",
    help="Fit the cost model against this OpenAI-compatible endpoint first.",
)
@click.option("--calibrate-model", help="Model for --calibrate [default: the first listed].")
@click.option("--calibrate-lengths", default="256,1024,4096", help="Probe prompt lengths.")
@click.option(
    "--api-key",
    envvar="KVMIGRATE_BENCH_API_KEY",
    help="Bearer key for --calibrate. " + prefer_env("KVMIGRATE_BENCH_API_KEY"),
)
@click.option(
    "--save-cost-model",
    type=OutputPath(),
    help="Write the cost model used as JSON; with --calibrate and no traffic, only calibrate.",
)
@click.option("--refine-replicas", type=_POSITIVE, metavar="N",
              help="Refine the cost model on the candidate's own recorded TTFTs, replayed "
              "on the N replicas that served them (the pilot's vLLM fleet).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the tables.")
@click.option(
    "--html",
    "html_path",
    type=OutputPath(),
    help="Also write a self-contained HTML page with charts to this file.",
)
def plan(**options: object) -> None:
    """Size a vLLM fleet for the recorded traffic: TTFT, prefix-cache hits and cost per
    fleet size, from a simulation.

    The recorded conversations replay at their recorded times through a simulated fleet
    of each size. The simulation models vLLM's prefix cache (hashed blocks, LRU
    eviction), continuous batching with chunked prefill, and the routing; step times come
    from a cost model that
    --calibrate fits against a real endpoint. The smallest fleet meeting --ttft-p95-slo is
    chosen, --headroom added, and priced against the hosted bill for the same traffic.
    Without --calibrate the speed is the H200 + 8B figures scaled to --gpu, --model and
    --gpus-per-replica (docs/plan.md), an estimate the plan warns of.
    """
    _run(_Options(**options))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class _Options:
    """The command's options, by the names click gives them."""

    config_path: str
    records: str | None
    since: str
    dataset: Path | None
    conversation_rate: float
    output_tokens: int | None
    think_time: float
    replicas: str
    gpu: str
    model_name: str
    gpus_per_replica: int
    weights_gb: float | None
    kv_bytes_per_token: int | None
    gpu_memory_utilization: float
    kv_blocks: int | None
    block_size: int
    max_batched_tokens: int
    max_seqs: int
    routing: str
    no_prefix_caching: bool
    rate_scale: float
    context_scale: float
    ttft_p95_slo: float
    headroom: float
    gpu_hour_price: float
    input_price: float
    cached_input_price: float
    output_price: float
    cost_model: Path | None
    calibrate_url: str | None
    calibrate_model: str | None
    calibrate_lengths: str
    api_key: str | None
    save_cost_model: Path | None
    refine_replicas: int | None
    as_json: bool
    html_path: Path | None


def _fleet(o: _Options, cost: CostModel) -> tuple[Fleet, tuple[str, ...]]:
    """The fleet to simulate, and what its speed rests on. The default cost model (the
    H200 + 8B measurements) is scaled to the GPU, model and width asked for; a measured
    one (--calibrate, --cost-model) is the speed of what it measured, and kept."""
    replica = _replica(o)
    blocks = _kv_blocks(o, replica)
    if o.calibrate_url or o.cost_model is not None:
        where = "calibrated" if o.calibrate_url else f"read from {o.cost_model}"
        notes: tuple[str, ...] = (
            f"Speed: {where}; --gpu, --model and --gpus-per-replica set only the KV cache.",
        )
    else:
        cost, factors = scaled_cost(cost, replica)
        notes = () if o.refine_replicas is not None else (speed_note(factors),)
    fleet = Fleet(
        kv_blocks=blocks,
        cost=cost,
        engine=EngineSettings(o.max_batched_tokens, o.max_seqs, o.block_size),
        routing=o.routing,
        prefix_caching=not o.no_prefix_caching,
    )
    return fleet, notes


def _refined(o: _Options, fleet: Fleet) -> tuple[Fleet, tuple[str, ...]]:
    """The fleet with its cost model refined on the candidate's records (--refine-replicas)."""
    if o.refine_replicas is None:
        return fleet, ()
    if o.dataset is not None:
        raise click.UsageError("--refine-replicas needs recorded traffic, not --dataset")
    candidate = load_or_exit(o.config_path, secrets_required=False).rollout.candidate
    recorded = _workload(None, o.records, o.config_path, o.since, (1.0, 0.0), candidate)
    label = f"{fleet.cost.source}, refined on {len(recorded.requests):,} {candidate} records"
    try:
        cost, rms = refine(recorded, fleet, o.refine_replicas, label)
    except ValueError as exc:
        raise click.ClickException(f"cannot refine: {exc}") from None
    note = (
        f"Cost model refined on {candidate}'s {len(recorded.requests):,} recorded calls "
        f"replayed on {o.refine_replicas} replica(s): RMS log error {rms:.2f} on TTFT p50 by turn."
    )
    return replace(fleet, cost=cost), (note,)


def _run(o: _Options) -> None:
    try:
        sizes = parse_sizes(o.replicas)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--replicas") from None
    cost = _cost_model(o.cost_model, o.calibrate_url, o.api_key, o.calibrate_model,
                       o.calibrate_lengths)  # fmt: skip
    if o.calibrate_url and o.save_cost_model and o.dataset is None and o.records is None:
        write_output(o.save_cost_model, json.dumps(cost.to_json(), indent=2) + "\n")
        click.echo(json.dumps(cost.to_json(), indent=2))
        return
    fleet, speed = _fleet(o, cost)
    fleet, refined = _refined(o, fleet)
    if o.save_cost_model is not None:
        write_output(o.save_cost_model, json.dumps(fleet.cost.to_json(), indent=2) + "\n")
    pacing = (o.conversation_rate, o.think_time)
    workload = _workload(
        o.dataset, o.records, o.config_path, o.since, pacing, None, o.output_tokens
    )
    workload = scaled(workload, o.rate_scale, o.context_scale)
    prices = Prices(o.input_price, o.cached_input_price, o.output_price, o.gpu_hour_price)
    costs = Costs(o.gpus_per_replica, o.gpu_hour_price, hosted_monthly(workload, prices))
    progress = None if o.as_json else (lambda n: click.echo(f"simulated {n} replica(s)", err=True))
    slo = o.ttft_p95_slo / 1000.0
    result = sweep(workload, fleet, sizes, slo, costs, progress, o.headroom / 100.0)
    notes = _notes(o.dataset, o.conversation_rate, o.think_time, o.rate_scale, o.context_scale)
    result = replace(result, notes=speed + refined + workload.notes + notes)
    _emit(result, o.as_json, o.html_path)
    if result.chosen is None:
        sys.exit(1)
