"""A recommended `vllm serve` command line for a model on a GPU, with a reason for each flag.

The flags are the ones the migration depends on: prefix caching (the win), chunked prefill
(long agent prompts without stalling other streams), prompt-token details (to see the
cache), the tool-call parser of the model's family, the context length, and memory. The
weight size comes from the parameter count in the model's name (`8B`, `70b`), at 2 bytes a
parameter (bf16), or about 0.55 for gpt-oss's MXFP4 weights; tensor parallelism is proposed
when the weights would take more than 60% of one GPU, leaving the rest for the KV cache.
Beyond one node (8 GPUs), tensor parallelism stays inside a node, where GPUs talk over
NVLink or PCIe, and pipeline parallelism spans the nodes, as vLLM's distributed serving
guide recommends: tensor parallelism across a network would stall every layer.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

from kvmigrate.doctor.families import UNKNOWN_FAMILY_HINT, tool_parser

# Memory in GB of one device, by the names people use for them.
GPU_MEMORY_GB: dict[str, int] = {
    "H100": 80,
    "H200": 141,
    "B200": 180,
    "GH200": 96,
    "A100": 80,
    "A100-40GB": 40,
    "L40S": 48,
    "L40": 48,
    "L4": 24,
    "A10G": 24,
    "A10": 24,
    "RTX4090": 24,
    "MI300X": 192,
}
WEIGHT_SHARE = 0.6
DEFAULT_MAX_MODEL_LEN = 32_768
GPUS_PER_NODE = 8
_PARAMS = re.compile(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")


@dataclass(frozen=True, slots=True)
class Flag:
    args: tuple[str, ...]
    why: str


@dataclass(frozen=True, slots=True)
class ServeCommand:
    model: str
    gpu: str
    flags: tuple[Flag, ...]

    @property
    def argv(self) -> list[str]:
        return ["vllm", "serve", self.model, *(a for f in self.flags for a in f.args)]

    def text(self) -> str:
        lines = [f"vllm serve {shlex.quote(self.model)}"]
        lines += ["  " + " ".join(_shell(a) for a in f.args) for f in self.flags]
        command = " \\\n".join(lines)
        reasons = "\n".join(f"# {' '.join(f.args)}: {f.why}" for f in self.flags)
        return f"{command}\n\n{reasons}"


def _shell(arg: str) -> str:
    """Quote for a POSIX shell, but let an environment variable expand."""
    return f'"{arg}"' if re.fullmatch(r"\$[A-Z_]+", arg) else shlex.quote(arg)


def gpu_memory_gb(gpu: str) -> int:
    key = gpu.upper().replace(" ", "").removeprefix("NVIDIA")
    if key in GPU_MEMORY_GB:
        return GPU_MEMORY_GB[key]
    raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPU_MEMORY_GB)}")


def weight_gb(model: str) -> float | None:
    """Approximate weight size from the parameter count in the name, or None."""
    found = _PARAMS.findall(model.rsplit("/", 1)[-1])
    if not found:
        return None
    billions = float(found[-1])
    bytes_per_param = 0.55 if "gpt-oss" in model.lower() else 2.0
    return billions * bytes_per_param


def tensor_parallel(weights: float | None, memory: int) -> int:
    """The smallest power of two of GPUs whose memory holds the weights with KV room."""
    if weights is None:
        return 1
    size = 1
    while weights / size > memory * WEIGHT_SHARE and size < 64:
        size *= 2
    return size


def serve_command(
    model: str,
    gpu: str,
    max_model_len: int | None = None,
    length_source: str | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
) -> ServeCommand:
    """`length_source` says where `max_model_len` came from, so a length that differs
    between two runs says why."""
    memory = gpu_memory_gb(gpu)
    weights = weight_gb(model)
    gpus = tensor_parallel(weights, memory)
    length = max_model_len or DEFAULT_MAX_MODEL_LEN
    if max_model_len is None:
        length_source = (
            f"the default {DEFAULT_MAX_MODEL_LEN}: no hosted model's context is known here "
            "(pass --max-model-len, or a --config whose models map this one to a hosted "
            "model)"
        )
    parser = tool_parser(model)
    flags = [
        Flag(("--enable-prefix-caching",),
             "keeps each conversation's KV blocks so the next turn prefills only its new "
             "tokens, which is the whole TTFT win (on by default in vLLM V1; explicit so "
             "nobody turns it off)."),
        Flag(("--enable-chunked-prefill", "--max-num-batched-tokens", "8192"),
             "splits a long prefill into 8192-token steps batched with running decodes, so "
             "one long agent prompt does not stall every other stream's next token."),
        Flag(("--enable-prompt-tokens-details",),
             "reports usage.prompt_tokens_details.cached_tokens, which kvmigrate's reports, "
             "bench and doctor read to show cache hits per request."),
        Flag(("--enable-auto-tool-choice", "--tool-call-parser", parser or "PARSER"),
             ("accepts tool_choice: auto as the hosted API does and parses tool calls in the "
              f"{parser} format of this model family; without it vLLM answers 400.")
             if parser else
             "accepts tool_choice: auto; replace PARSER with the family's parser "
             f"({UNKNOWN_FAMILY_HINT})."),
        Flag(("--max-model-len", str(length)),
             "the longest prompt plus answer accepted; match the context the hosted model "
             "offers your traffic, or longer conversations get a 400 and fall back. This "
             f"value: {length_source or 'given'}."),
        Flag(("--gpu-memory-utilization", "0.90"),
             "lets vLLM take 90% of GPU memory; what the weights leave becomes KV cache, "
             "i.e. how many conversations stay cached at once."),
        Flag(("--generation-config", "vllm"),
             "ignores the sampling defaults in the model's generation_config.json, which "
             "would otherwise silently differ from the hosted API's."),
        Flag(("--api-key", "$VLLM_API_KEY"),
             "requires a bearer key; the proxy sends it from backends.vllm.api_key."),
    ]  # fmt: skip
    flags[:0] = _parallel(gpus, weights, gpu, gpus_per_node)
    return ServeCommand(model, gpu, tuple(flags))


def _parallel(gpus: int, weights: float | None, gpu: str, per_node: int) -> list[Flag]:
    if gpus <= 1 or weights is None:
        return []
    room = f"so at least {math.floor((1 - WEIGHT_SHARE) * 100)}% of each GPU stays KV cache"
    if gpus <= per_node:
        why = f"shards the weights (about {weights:.0f} GB) over {gpus} {gpu} GPUs, {room}."
        return [Flag(("--tensor-parallel-size", str(gpus)), why)]
    nodes = math.ceil(gpus / per_node)
    return [
        Flag(("--tensor-parallel-size", str(per_node)),
             f"shards each layer over the {per_node} {gpu} GPUs of one node: the weights "
             f"(about {weights:.0f} GB) need {gpus} {gpu} GPUs, {room}, more than one node "
             "holds, and tensor parallelism across a network would stall every layer."),
        Flag(("--pipeline-parallel-size", str(nodes)),
             f"splits the layers over {nodes} nodes of {per_node} GPUs. Multi-node vLLM "
             "runs on a Ray cluster: `ray start --head` on one node, `ray start --address "
             "HEAD:6379` on the others, then this command on the head; or use fewer, larger "
             "GPUs (H100, H200) to stay on one node."),
        Flag(("--distributed-executor-backend", "ray"),
             "pipeline parallelism across nodes runs its workers through Ray."),
    ]  # fmt: skip
