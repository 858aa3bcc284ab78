"""YAML aliases of aliases (a "billion laughs") are refused as the file is read, wherever
they sit, with a short error naming the alias's line; a value of any size is quoted short.
A config that shares settings with merges and a few aliases still loads."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvmigrate.config import ConfigError, parse_config

BACKENDS = """backends:
  hosted: {api_base: "http://127.0.0.1:9/v1"}
  vllm: {api_base: "http://127.0.0.1:8/v1"}
"""
MODELS = "models:\n  - {model_name: m, hosted: m, vllm: m}\n"
SHORT = 2000  # what a refusal may take, at most, whatever the file


def ladder(indent: int, levels: int = 9, leaf: str = "1") -> str:
    """A block sequence of anchors, each a list of nine aliases of the one before: the last
    stands for 9^levels leaves, in a few hundred bytes."""
    pad = " " * indent
    lines = [f"{pad}- &h0 [{', '.join([leaf] * 9)}]"]
    lines += [f"{pad}- &h{i} [{', '.join([f'*h{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


SHAPES = {
    "steps": BACKENDS + MODELS + "rollout:\n  steps:\n" + ladder(4),
    "candidates": BACKENDS + "models:\n  - model_name: m\n    hosted: m\n    vllm: m\n"
    "    candidates:\n" + ladder(6, leaf="vllm"),
    "candidate_headers": "backends:\n  hosted: {api_base: 'http://127.0.0.1:9/v1'}\n"
    "  vllm:\n    api_base: http://127.0.0.1:8/v1\n    candidate_headers:\n"
    + ladder(6, leaf="x-a")
    + MODELS,
    "litellm_params": "backends:\n  hosted:\n    type: litellm\n    litellm_params:\n"
    "      extra:\n" + ladder(8) + "  vllm: {api_base: 'http://127.0.0.1:8/v1'}\n" + MODELS,
    "top level": BACKENDS + MODELS + "junk:\n" + ladder(2),
    "merge keys": BACKENDS + MODELS + "merges:\n  - &m0 {a: 1, b: 2, c: 3}\n" + "".join(
        f"  - &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], k{i}: 1}}\n" for i in range(1, 9)
    ),
    # The probe's own shape: the anchors in one place, one alias of the last elsewhere.
    "steps: *h": "anchors:\n" + ladder(2) + BACKENDS + MODELS + "rollout: {steps: *h9}\n",
}  # fmt: skip


def _refusal(text: str) -> str:
    started = time.perf_counter()
    with pytest.raises(ConfigError) as refused:
        parse_config(text, env={})
    assert time.perf_counter() - started < 5
    return str(refused.value)


@pytest.mark.parametrize("text", SHAPES.values(), ids=SHAPES.keys())
def test_a_billion_laughs_is_refused_at_once_with_a_short_error(text: str) -> None:
    message = _refusal(text)
    assert "takes the document past 100,000 nodes" in message
    assert "billion laughs" in message
    assert len(message) < SHORT
    # The line of the alias that crossed the bound: within the ladder.
    line = int(message.split("line ", 1)[1].split(",", 1)[0])
    assert "*" in text.splitlines()[line - 1]


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    message = _refusal(BACKENDS + MODELS + "rollout: {steps: &s [10, *s]}\n")
    assert message == (
        "<config>: not valid YAML: line 6, column 26: the alias *s is inside the node it "
        "names (&s), which never ends"
    )


def test_merges_and_a_few_aliases_still_load() -> None:
    text = """backends:
  hosted: &defaults {api_base: "http://127.0.0.1:9/v1", read_timeout: 30, connect_timeout: 2}
  vllm: {<<: *defaults, api_base: "http://127.0.0.1:8/v1"}
  vllm-fp8: {<<: *defaults, api_base: ["http://127.0.0.1:7/v1", "http://127.0.0.1:6/v1"]}
models:
  - &route {model_name: m, hosted: m, vllm: m, vllm-fp8: m, candidates: &both [vllm, vllm-fp8]}
  - {<<: *route, model_name: n, candidates: *both}
rollout: {steps: &steps [10, 50, 100]}
cohorts:
  - {name: beta, model: m, match: {header: {x-tier: beta}}, steps: *steps}
"""
    config = parse_config(text, env={})
    assert config.backends["vllm-fp8"].read_timeout == 30
    assert config.backends["vllm"].api_base == "http://127.0.0.1:8/v1"
    assert config.models[1].candidates == ("vllm", "vllm-fp8")
    assert config.cohorts[0].steps == (10.0, 50.0, 100.0)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (BACKENDS + MODELS + f"rollout: {{mode: {'m' * 1_000_000}}}\n", "rollout.mode"),
        (BACKENDS + MODELS + f"rollout: {{steps: [{'[1, ' * 50 + '1' + ']' * 50}]}}\n", "steps[0]"),
        (BACKENDS + MODELS + f"rollout: {{steps: [[{', '.join(['5'] * 50_000)}]]}}\n", "steps[0]"),
        (BACKENDS + MODELS + f"? {'k' * 1_000_000}\n: 1\n", "kkkk"),
        (BACKENDS + MODELS + f"record: {{db: 'mysql://{'d' * 1_000_000}'}}\n", "record.db"),
    ],
    ids=["long-string", "deep-list", "long-list", "long-key", "long-url"],
)
def test_a_value_of_any_size_is_quoted_short(text: str, path: str) -> None:
    message = _refusal(text)
    assert path in message
    assert len(message) < SHORT


def test_config_check_prints_a_short_error_for_a_bomb(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(SHAPES["steps: *h"])
    done = subprocess.run(
        [sys.executable, "-m", "kvmigrate", "config", "check", "--config", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert f"{config}: not valid YAML: line " in done.stderr
    assert "takes the document past 100,000 nodes" in done.stderr
    assert len(done.stdout + done.stderr) < SHORT
