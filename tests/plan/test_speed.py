"""The default cost model carried to another GPU, model and tensor-parallel width: prefill
by params / FLOPs, decode by weight bytes / bandwidth, from the data-sheet figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvmigrate.cli import main
from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.hardware import GPUS, MODELS, Replica
from kvmigrate.plan.speed import TP_EFFICIENCY, scale, scaled_cost

# (GPU, model, GPUs) -> (prompt-token factor, decode-step factor), from the data sheets:
# H200 989 TFLOPS / 4.8 TB/s; H100 989 / 3.35; L4 121 / 0.3; A10G 125 / 0.6; an 8B model
# 8.03 B params in 16.1 GB, a 70B 70.6 B in 141.1 GB; two GPUs 2 x 0.85 = 1.7 times one.
FACTORS = {
    "h200 8b": ("h200", "llama-3.1-8b", 1, 1.0, 1.0),
    "h100 8b": ("h100", "llama-3.1-8b", 1, 1.0, 4.8 / 3.35),
    "l4 8b": ("l4", "llama-3.1-8b", 1, 989 / 121, 4.8 / 0.3),
    "a10g 8b": ("a10g", "llama-3.1-8b", 1, 989 / 125, 4.8 / 0.6),
    "2 x h200 70b": ("h200", "llama-3.1-70b", 2, 70.6 / 8.03 / 1.7, 141.1 / 16.1 / 1.7),
    "4 x h100 70b": ("h100", "llama-3.1-70b", 4, 70.6 / 8.03 / 3.4, 141.1 / 16.1 * 4.8 / 3.35 / 3.4),
    # MI300X: 1,307 TFLOPS dense bf16, 5.3 TB/s (AMD's data sheet)
    "mi300x 8b": ("mi300x", "llama-3.1-8b", 1, 989 / 1307, 4.8 / 5.3),
    "mi300x 70b": ("mi300x", "llama-3.1-70b", 1, 70.6 / 8.03 * 989 / 1307, 141.1 / 16.1 * 4.8 / 5.3),
    # Mixtures of experts compute with their active params, read all their weights:
    # Mixtral 12.9 B of 46.7 B (93.4 GB), Qwen3-30B-A3B 3.3 B of 30.5 B (61.0 GB)
    "h200 mixtral": ("h200", "mixtral-8x7b", 1, 12.9 / 8.03, 93.4 / 16.1),
    "h100 qwen3 moe": ("h100", "qwen3-30b-a3b", 1, 3.3 / 8.03, 61.0 / 16.1 * 4.8 / 3.35),
}  # fmt: skip


@pytest.mark.parametrize(("gpu", "model", "gpus", "compute", "memory"), FACTORS.values(),
                         ids=FACTORS.keys())  # fmt: skip
def test_scale_factors(gpu: str, model: str, gpus: int, compute: float, memory: float) -> None:
    assert TP_EFFICIENCY == 0.85
    got = scale(Replica(GPUS[gpu], MODELS[model], gpus))
    assert got.compute == pytest.approx(compute)
    assert got.memory == pytest.approx(memory)


def test_the_scaled_model_keeps_the_request_time_and_scales_the_rest() -> None:
    base = CostModel(attention_s=1e-9)
    cost, factors = scaled_cost(base, Replica(GPUS["l4"], MODELS["llama-3.1-8b"]))
    assert cost.prefill_token_s == pytest.approx(base.prefill_token_s * factors.compute)
    assert cost.cached_token_s == pytest.approx(base.cached_token_s * factors.compute)
    assert cost.attention_s == pytest.approx(base.attention_s * factors.compute)
    assert cost.overhead_s == pytest.approx(base.overhead_s * factors.memory)
    assert cost.decode_seq_s == pytest.approx(base.decode_seq_s * factors.memory)
    assert cost.request_s == base.request_s  # HTTP and tokenizing run on the CPU
    assert cost.source.startswith("estimate:")


PROMPT = 10_150  # tokens: 4 of template + 40,584 characters at 4 a token


def _plan(tmp_path: Path, *args: str) -> dict[str, Any]:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * 40_584}]}) + "\n")
    result = CliRunner().invoke(
        main,
        [
            "plan",
            "--dataset",
            str(path),
            "--replicas",
            "1",
            "--ttft-p95-slo",
            "60000",
            "--json",
            *args,
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


@pytest.mark.parametrize(
    ("args", "compute", "memory"),
    [
        ((), 1.0, 1.0),
        (("--gpu", "l4"), 989 / 121, 4.8 / 0.3),
        (("--gpu", "a10g"), 989 / 125, 4.8 / 0.6),
        (("--model", "llama-3.1-70b", "--gpus-per-replica", "2"), 70.6 / 8.03 / 1.7,
         141.1 / 16.1 / 1.7),
    ],
)  # fmt: skip
def test_a_10150_token_prefill_takes_the_scaled_time(
    tmp_path: Path, args: tuple[str, ...], compute: float, memory: float
) -> None:
    """Two chunks of the 8,192-token budget, each a step of 5 ms (scaled as a decode step
    is) plus its tokens at 1/32,500 s (scaled as prefill), and 5 ms of HTTP."""
    data = _plan(tmp_path, *args)
    expected = 2 * 0.005 * memory + PROMPT / 32_500 * compute + 0.005
    assert data["sizes"][0]["ttft_p50_s"] == pytest.approx(expected)
    assert any(n.startswith("WARNING: speeds are an estimate") for n in data["notes"])
    if args:
        assert "--calibrate URL" in data["notes"][0]
        assert f"prompt tokens x{compute:.2f}" in data["notes"][0]


def test_a_measured_cost_model_is_kept_whatever_the_gpu(tmp_path: Path) -> None:
    saved = tmp_path / "cost.json"
    saved.write_text(json.dumps(CostModel(source="calibrated against x").to_json()))
    data = _plan(tmp_path, "--gpu", "l4", "--cost-model", str(saved))
    assert data["cost_model"] == json.loads(saved.read_text())
    assert data["notes"][0].startswith(f"Speed: read from {saved}; --gpu, --model")


def _ttft(tmp_path: Path, *args: str) -> float:
    value: float = _plan(tmp_path, *args)["sizes"][0]["ttft_p50_s"]
    return value


@pytest.mark.parametrize(
    ("slow", "fast", "ratio"),
    [
        # Published dense bf16 throughput, which a long prefill runs at: H200 989, A10G 125
        (("--gpu", "a10g"), ("--gpu", "h200"), 989 / 125),
        # The same GPU, 70.6 B against 8.03 B active params (both fit one MI300X's 192 GB)
        (("--gpu", "mi300x", "--model", "llama-3.1-70b"), ("--gpu", "mi300x"), 70.6 / 8.03),
        # A mixture of experts prefills at its 12.9 B active params, not its 46.7 B total
        (("--gpu", "mi300x", "--model", "mixtral-8x7b"), ("--gpu", "mi300x"), 12.9 / 8.03),
    ],
    ids=["a10g vs h200", "70b vs 8b", "mixtral vs 8b"],
)
def test_plans_for_the_same_traffic_differ_by_the_published_ratio(
    tmp_path: Path, slow: tuple[str, ...], fast: tuple[str, ...], ratio: float
) -> None:
    """The issue's test: TTFT of a 10,150-token prompt, mostly prefill, differs between two
    plans by the ratio of prefill throughput (FLOPs / active params), within 25%."""
    got = _ttft(tmp_path, *slow) / _ttft(tmp_path, *fast)
    assert got == pytest.approx(ratio, rel=0.25)


def test_a_mixture_of_experts_holds_all_its_weights_in_memory() -> None:
    """Its KV cache is what the total weights leave: 0.9 x 192 GB - 93.4 GB on an MI300X,
    at 2 x 32 layers x 8 KV heads x 128 x 2 bytes a token."""
    replica = Replica(GPUS["mi300x"], MODELS["mixtral-8x7b"])
    assert replica.kv_tokens() == int((0.9 * 192 - 93.4) * 1e9 // (2 * 32 * 8 * 128 * 2))
