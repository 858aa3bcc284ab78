"""GPUs and models: how many KV-cache blocks one replica holds, and how fast it runs.

A replica's KV cache is what its GPUs' memory leaves once the weights are loaded, at vLLM's
`gpu_memory_utilization` (0.9 by default). Per token the cache holds a key and a value per
layer and KV head: 2 * layers * kv_heads * head_dim * bytes (2 for bf16). The figures are
the models' published configs; pass `--weights-gb` and `--kv-bytes-per-token` for others.

Speed (`kvmigrate.plan.speed`) scales from each GPU's memory bandwidth and dense bf16
tensor throughput (no sparsity), from the vendors' data sheets (NVIDIA's SXM parts for
H100/H200/A100, the A10G taken as the A10; AMD's MI300X OAM), and from each model's
parameter counts. A mixture-of-experts model has two: every token runs through its
`active_params_b` (the router picks a few experts), so compute scales with those, while
its memory holds all `params_b`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

GB = 1e9
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    memory_gb: float
    bandwidth_tbs: float  # HBM/GDDR bandwidth, TB/s: what a decode step waits on
    bf16_tflops: float  # dense bf16 tensor throughput: what a prefill waits on


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    weights_gb: float  # bf16
    layers: int
    kv_heads: int
    head_dim: int = 128
    dtype_bytes: int = 2
    params_b: float = 8.03  # billions of parameters, all held in memory
    # Mixture of experts: the billions each token runs through (2 FLOPs each); None: dense
    active_params_b: float | None = None

    @property
    def active_b(self) -> float:
        """Billions of parameters a token's forward pass computes with."""
        return self.params_b if self.active_params_b is None else self.active_params_b

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


GPUS = {
    g.name: g
    for g in (
        Gpu("h200", 141.0, 4.8, 989.0),
        Gpu("h100", 80.0, 3.35, 989.0),
        Gpu("a100-80gb", 80.0, 2.039, 312.0),
        Gpu("a100-40gb", 40.0, 1.555, 312.0),
        Gpu("l40s", 48.0, 0.864, 362.0),
        Gpu("a10g", 24.0, 0.6, 125.0),
        Gpu("l4", 24.0, 0.3, 121.0),
        Gpu("mi300x", 192.0, 5.3, 1307.0),
    )
}

MODELS = {
    m.name: m
    for m in (
        Model("llama-3.1-8b", 16.1, 32, 8, params_b=8.03),
        Model("llama-3.1-70b", 141.1, 80, 8, params_b=70.6),
        Model("llama-3.2-3b", 6.4, 28, 8, params_b=3.21),
        Model("qwen2.5-7b", 15.2, 28, 4, params_b=7.62),
        Model("qwen2.5-32b", 65.5, 64, 8, params_b=32.8),
        Model("mistral-7b", 14.5, 32, 8, params_b=7.25),
        # Mixtures of experts: 2 of 8 experts per token, and 8 of 128.
        Model("mixtral-8x7b", 93.4, 32, 8, params_b=46.7, active_params_b=12.9),
        Model("qwen3-30b-a3b", 61.0, 48, 4, params_b=30.5, active_params_b=3.3),
    )
}


class HardwareError(ValueError):
    """A GPU/model combination that leaves no room for the KV cache."""


@dataclass(frozen=True, slots=True)
class Replica:
    """One vLLM server: `gpus` GPUs (tensor parallel) holding one copy of the model."""

    gpu: Gpu
    model: Model
    gpus: int = 1
    memory_utilization: float = 0.9
    kv_bytes_per_token: int | None = None  # None: from the model's config

    def kv_tokens(self) -> int:
        per_token = self.kv_bytes_per_token or self.model.kv_bytes_per_token
        free = self.gpu.memory_gb * self.gpus * self.memory_utilization - self.model.weights_gb
        if free <= 0:
            raise HardwareError(
                f"{self.model.name} ({self.model.weights_gb:g} GB) does not fit on "
                f"{self.gpus} x {self.gpu.name} at {self.memory_utilization:.0%} memory; "
                "use more --gpus-per-replica"
            )
        return int(free * GB // per_token)

    def kv_blocks(self, block_size: int) -> int:
        return max(1, math.floor(self.kv_tokens() / block_size))


def lookup(table: dict[str, T], name: str, what: str) -> T:
    key = name.lower()
    if key not in table:
        raise HardwareError(f"unknown {what} {name!r}; known: {', '.join(sorted(table))}")
    return table[key]
