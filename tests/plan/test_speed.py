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
