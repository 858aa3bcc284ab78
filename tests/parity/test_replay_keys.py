"""Which key `kvmigrate parity` sends a primary configured without one: the variable its
own API's SDK reads, never another provider's, and never anything to the candidate."""

from __future__ import annotations

import pytest

from kvmigrate.config import parse_config
from kvmigrate.parity.replay import targets_from_config

ENV = {
    "OPENAI_API_KEY": "sk-openai-from-env",
    "AZURE_OPENAI_API_KEY": "azure-from-env",
    "ANTHROPIC_API_KEY": "sk-ant-from-env",
}
PRIMARIES = {
    "openai": '{api_base: "https://api.openai.com/v1"}',
    "azure": '{type: azure, api_base: "https://x.openai.azure.com", api_version: "2024-10-21"}',
    "anthropic": '{type: anthropic, api_base: "https://api.anthropic.com/v1"}',
}


def config_with(primary: str) -> str:
    return f"""
backends:
  hosted: {primary}
  vllm: {{api_base: "http://10.0.0.1:8000/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: llama}}
"""


@pytest.mark.parametrize(
    ("kind", "env", "expected"),
    [
        ("openai", ENV, "sk-openai-from-env"),
        ("azure", ENV, "azure-from-env"),
        ("anthropic", ENV, "sk-ant-from-env"),
        # Only another provider's key is set: none is sent rather than the wrong one.
        ("anthropic", {"OPENAI_API_KEY": "sk-openai-from-env"}, None),
        ("azure", {"OPENAI_API_KEY": "sk-openai-from-env"}, None),
        ("openai", {"ANTHROPIC_API_KEY": "sk-ant-from-env"}, None),
    ],
)
def test_a_primary_without_a_key_falls_back_on_its_own_apis_variable(
    kind: str, env: dict[str, str], expected: str | None
) -> None:
    config = parse_config(config_with(PRIMARIES[kind]), env={})
    primary, candidate = targets_from_config(config, env=env)
    assert primary.api_key == expected
    assert candidate.api_key is None


def test_a_configured_key_or_an_explicit_one_wins_over_the_environment() -> None:
    configured = parse_config(
        config_with('{type: anthropic, api_base: "https://a.test/v1", api_key: sk-ant-cfg}'),
        env={},
    )
    assert targets_from_config(configured, env=ENV)[0].api_key == "sk-ant-cfg"
    bare = parse_config(config_with(PRIMARIES["anthropic"]), env={})
    assert targets_from_config(bare, "sk-ant-given", env=ENV)[0].api_key == "sk-ant-given"
