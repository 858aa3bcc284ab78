"""A tiny Qwen2 model directory built locally, so a real vLLM can serve without any download.

The directory holds a byte-level BPE tokenizer trained on generated text, a ChatML chat
template, and a `config.json`; there are no weights, because the server is started with
`--load-format dummy` (random weights). Its answers are gibberish, but everything the
proxy cares about is real: tokenisation, the chat template, prefix caching, usage, streaming
and errors.

Training needs the `tokenizers` library, which lives in the vLLM venv and not in the
project's own. So `ensure_tiny_model()` (called from the project venv) runs this module
with the vLLM venv's python: `python -m kvmigrate.testbed.tiny_model --shape tiny DIR`.
Built models are cached under `~/.cache/kvmigrate/models/<shape>-<hash>`, where the hash
covers this module's and the template's source, so any change to the recipe rebuilds.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmigrate.testbed import chatml
from kvmigrate.testbed.locking import file_lock

MODELS_ENV = "KVMIGRATE_MODELS_DIR"
COMPLETE_MARKER = ".kvmigrate-complete"
BPE_VOCAB_SIZE = 4000
VOCAB_MULTIPLE = 64
MAX_POSITIONS = 4096


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


# "tiny" starts fastest; "bench" is big enough that a prefix-cache hit shows up in TTFT.
SHAPES: dict[str, Shape] = {
    "tiny": Shape(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=32, intermediate=384),
    "bench": Shape(hidden=512, layers=4, heads=8, kv_heads=4, head_dim=64, intermediate=1536),
}

_WORD_TEXT = (
    "the a an of to and in is for on with that this it as be by are from at or not we you "
    "agent tool call function result error retry request response stream token cache prefix "
    "model server client proxy route rollout shadow split parity latency budget config file "
    "user assistant system message turn conversation session history context window reply "
    "search read write list update delete create open close send fetch parse render check "
    "python json yaml http status code value name arguments query path line test build run "
    "please could would should will can may must first then next finally because however "
    "weather city temperature forecast today tomorrow order item price total customer ticket"
)
_WORDS = _WORD_TEXT.split()
_PUNCT = (".", ",", "?", "!", ":", ";")


def models_root() -> Path:
    override = os.environ.get(MODELS_ENV)
    return Path(override) if override else Path.home() / ".cache" / "kvmigrate" / "models"


def recipe_hash(shape: str) -> str:
    """Hash what determines the built files: the recipe's source and the shape."""
    digest = hashlib.sha256(shape.encode())
    for module_file in (__file__, chatml.__file__):
        digest.update(Path(module_file).read_bytes())
    return digest.hexdigest()[:16]


def ensure_tiny_model(shape: str = "tiny", python: Path | None = None) -> Path:
    """Return the cached model directory for `shape`, building it first when missing.

    `python` is an interpreter that has `tokenizers` (default: the vLLM venv's).
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose from {sorted(SHAPES)}")
    root = models_root()
    target = root / f"{shape}-{recipe_hash(shape)}"
    if (target / COMPLETE_MARKER).exists():
        return target
    with file_lock(root / ".lock"):
        if (target / COMPLETE_MARKER).exists():  # another process built it while we waited
            return target
        shutil.rmtree(target, ignore_errors=True)  # a half-built leftover
        # Build beside the target and rename, so readers never see a partial directory.
        staging = Path(tempfile.mkdtemp(prefix=f".{shape}-", dir=root))
        staging.chmod(0o755)  # mkdtemp makes it private; the model is not a secret
        try:
            run_builder(staging, shape, python)
            (staging / COMPLETE_MARKER).write_text(recipe_hash(shape) + "\n")
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def run_builder(directory: Path, shape: str, python: Path | None = None) -> None:
    """Build the model into `directory` in a child process that has `tokenizers`."""
    if python is None:
        from kvmigrate.testbed.vllm_venv import venv_python

        python = venv_python()
    repo_root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    command = [str(python), "-m", "kvmigrate.testbed.tiny_model", "--shape", shape]
    result = subprocess.run(
        [*command, str(directory)], env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"building the {shape} model failed (exit {result.returncode}):\n"
            f"{result.stderr[-4000:]}"
        )


def build_model(directory: Path, shape: str = "tiny") -> None:
    """Write the tokenizer, template and config files into `directory` (needs `tokenizers`)."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(corpus(seed=0))
    tokenizer.save(str(directory / "tokenizer.json"))
    ids = {token: tokenizer.token_to_id(token) for token in chatml.SPECIAL_TOKENS}
    vocab_size = padded(tokenizer.get_vocab_size(with_added_tokens=True), VOCAB_MULTIPLE)
    files = {
        "tokenizer_config.json": tokenizer_config(),
        "config.json": model_config(SHAPES[shape], vocab_size, ids),
        "generation_config.json": generation_config(ids),
    }
    for name, content in files.items():
        (directory / name).write_text(json.dumps(content, indent=2) + "\n")


def corpus(seed: int, sentences: int = 20000) -> list[str]:
    """Deterministic agent-flavoured prose with numbers and JSON, to train the tokenizer on."""
    rng = random.Random(seed)
    lines = []
    for index in range(sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 18))]
        words[0] = words[0].capitalize()
        line = " ".join(words) + rng.choice(_PUNCT)
        if index % 7 == 0:
            arguments = {rng.choice(_WORDS): rng.randint(0, 9999), "q": rng.choice(_WORDS)}
            line += " " + json.dumps({"name": rng.choice(_WORDS), "arguments": arguments})
        lines.append(line)
    return lines


def train_tokenizer(lines: list[str]) -> Any:
    """Train a byte-level BPE (GPT-2/Qwen style) tokenizer; returns a `tokenizers.Tokenizer`.

    `tokenizers` is imported by name at run time because the project's own venv (where mypy
    runs) does not have it; only the vLLM venv does.
    """
    tk = importlib.import_module("tokenizers")
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.post_processor = tk.processors.ByteLevel(trim_offsets=False)
    trainer = tk.trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(chatml.SPECIAL_TOKENS),
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.add_tokens(
        [tk.AddedToken(tag, special=False, normalized=False) for tag in chatml.TOOL_TOKENS]
    )
    return tokenizer


def padded(size: int, multiple: int) -> int:
    return -(-size // multiple) * multiple


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": chatml.CHAT_TEMPLATE,
        "bos_token": None,
        "eos_token": chatml.IM_END,
        "pad_token": chatml.END_OF_TEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
    }


def model_config(shape: Shape, vocab_size: int, ids: dict[str, int]) -> dict[str, Any]:
    rope_theta = 1_000_000.0
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "max_window_layers": shape.layers,
        "rms_norm_eps": 1e-6,
        # Both spellings: transformers 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids[chatml.END_OF_TEXT],
        "eos_token_id": ids[chatml.IM_END],
        "pad_token_id": ids[chatml.END_OF_TEXT],
    }


def generation_config(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "bos_token_id": ids[chatml.END_OF_TEXT],
        "eos_token_id": [ids[chatml.IM_END], ids[chatml.END_OF_TEXT]],
        "pad_token_id": ids[chatml.END_OF_TEXT],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the tiny test model (needs tokenizers).")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    build_model(args.directory, args.shape)
    print(args.directory, file=sys.stderr)


if __name__ == "__main__":
    main()
