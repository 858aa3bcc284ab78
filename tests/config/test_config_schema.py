"""The schema is the one place defaults and keys live: what a file leaves out is the
declared default, and `config_keys()` lists what the loader accepts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvmigrate.config import (
    ConfigError,
    RecordConfig,
    RolloutConfig,
    ServerConfig,
    config_keys,
    parse_config,
)
from kvmigrate.config.model import CacheCheckConfig

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = """
backends:
  hosted: {api_base: "https://api.openai.com/v1"}
  vllm: {api_base: "http://127.0.0.1:8000/v1"}
models:
  - {model_name: m, hosted: m, vllm: m}
"""


def test_what_a_file_leaves_out_is_the_declared_default() -> None:
    config = parse_config(MINIMAL, env={})
    assert config.server == ServerConfig()
    assert config.rollout == RolloutConfig()
    assert config.record == RecordConfig()
    assert config.cachecheck == CacheCheckConfig()
    assert config.primary.connect_timeout == 5.0
    assert config.primary.type == "openai"


def _paths(value: Any, path: str) -> Iterator[str]:
    """The key paths of a parsed file."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from _paths(item, f"{path}.{key}".lstrip("."))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        for entry in value:
            yield from _paths(entry, f"{path}[]")
    else:
        yield path


def _generic(path: str) -> str:
    """A path in `config_keys()` notation: names of the user's own (backends, litellm
    parameters, a model entry's backend keys) as `*`."""
    path = re.sub(r"^backends\.[^.]+", "backends.*", path)
    path = re.sub(r"litellm_params\..*", "litellm_params.*", path)
    return re.sub(r"^models\[\]\.(?!model_name$).*", "models[].*", path)


def test_every_key_of_the_example_is_listed() -> None:
    keys = set(config_keys())
    example = yaml.safe_load((ROOT / "config.yaml").read_text())
    found = {_generic(p) for p in _paths(example, "")}
    assert found - keys == set()
    assert {"rollout.gates.min_parity", "backends.*.litellm_params.*", "models[].*"} <= keys


@pytest.mark.parametrize("path", ["server.port", "record.workers", "rollout.gates.min_requests"])
def test_a_listed_key_is_accepted_and_its_neighbour_typo_is_not(path: str) -> None:
    section, *middle, key = path.split(".")
    nested = "".join(f"{m}: {{" for m in middle)
    closing = "}" * len(middle)
    accepted = parse_config(MINIMAL + f"{section}: {{{nested}{key}: 7{closing}}}\n", env={})
    assert accepted is not None
    with pytest.raises(ConfigError) as caught:
        parse_config(MINIMAL + f"{section}: {{{nested}{key}x: 7{closing}}}\n", env={})
    assert caught.value.path == f"{path}x"
    assert f"did you mean '{key}'" in caught.value.reason
