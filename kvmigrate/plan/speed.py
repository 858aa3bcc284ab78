"""The default cost model scaled to another GPU, model and tensor-parallel width: an
estimate, until `--calibrate` measures the real thing.

The default figures were measured for an 8B model on one H200 (`REFERENCE`). Two laws
carry them elsewhere, each the first-order cost of a transformer forward pass:
- a prompt token costs 2 FLOPs per active parameter, and prefill runs near the tensor
  cores' peak, so the per-token costs (prefill, cached, attention) scale as
  active params / (bf16 FLOPs x GPUs x TP efficiency);
- a decode step reads every weight once (and each sequence its own KV cache), and runs
  near the memory's peak, so the per-step and per-sequence costs scale as
  weight bytes / (bandwidth x GPUs x TP efficiency).
A mixture-of-experts model computes with its active parameters only, but a decode step
is taken to read all its weights: with a batch of more than a few sequences the router
sends some token to nearly every expert. (A lone sequence reads only its experts and
decodes faster than this says; the estimate errs slow, which is the safe side to buy on.)
Tensor parallelism across `gpus` GPUs splits both, less what the all-reduces between
them cost: `TP_EFFICIENCY` of linear, a round figure for NVLink (PCIe parts lose more).
The per-request time (HTTP, tokenizing) runs on the CPU and does not scale.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvmigrate.plan.cost_model import CostModel
from kvmigrate.plan.hardware import GPUS, MODELS, Replica

REFERENCE = Replica(GPUS["h200"], MODELS["llama-3.1-8b"])
TP_EFFICIENCY = 0.85  # a tensor-parallel replica of n GPUs runs 0.85 n times as fast as one


@dataclass(frozen=True, slots=True)
class Scale:
    """How many times longer than on the reference a prompt token and a decode step take."""

    compute: float  # prefill: active params / FLOPs
    memory: float  # decode: weight bytes / bandwidth

    @property
    def is_reference(self) -> bool:
        return self.compute == 1.0 and self.memory == 1.0


def parallel(gpus: int) -> float:
    """How many times one GPU's speed a tensor-parallel group of `gpus` reaches."""
    return 1.0 if gpus <= 1 else gpus * TP_EFFICIENCY


def scale(replica: Replica, reference: Replica = REFERENCE) -> Scale:
    speedup = parallel(replica.gpus) / parallel(reference.gpus)
    compute = (replica.model.active_b / reference.model.active_b) * (
        reference.gpu.bf16_tflops / replica.gpu.bf16_tflops
    )
    memory = (replica.model.weights_gb / reference.model.weights_gb) * (
        reference.gpu.bandwidth_tbs / replica.gpu.bandwidth_tbs
    )
    return Scale(compute / speedup, memory / speedup)


def scaled_cost(cost: CostModel, replica: Replica) -> tuple[CostModel, Scale]:
    """`cost` (measured on `REFERENCE`) as `replica` would run it, and the factors used."""
    factors = scale(replica)
    if factors.is_reference:
        return cost, factors
    label = (
        f"estimate: the H200 + 8B figures scaled to {replica.gpus} x {replica.gpu.name}, "
        f"{replica.model.name}"
    )
    return (
        replace(
            cost,
            prefill_token_s=cost.prefill_token_s * factors.compute,
            cached_token_s=cost.cached_token_s * factors.compute,
            attention_s=cost.attention_s * factors.compute,
            overhead_s=cost.overhead_s * factors.memory,
            decode_seq_s=cost.decode_seq_s * factors.memory,
            source=label,
        ),
        factors,
    )


def speed_note(factors: Scale) -> str:
    """What the plan's speed rests on, when it was not measured."""
    how = (
        "the default H200 + llama-3.1-8b figures"
        if factors.is_reference
        else (
            f"scaled from the H200 + llama-3.1-8b figures: prompt tokens x{factors.compute:.2f} "
            f"(active params / dense bf16 FLOPs), decode steps x{factors.memory:.2f} "
            f"(weight bytes / memory bandwidth), tensor parallel at {TP_EFFICIENCY:.0%} of linear"
        )
    )
    return (
        f"WARNING: speeds are an estimate, {how}, not measured; calibrate on the hardware you "
        "plan to buy (--calibrate URL) before buying on them."
    )
