"""Config values an unlucky operator or a hostile file can hold: each is a ConfigError naming
its key, or loads, and never a traceback or a hang."""

from __future__ import annotations

import pytest

from kvmigrate.config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("api_base", "reason"),
    [
        ("http://[x/v1", "Invalid IPv6 URL"),
        ("http://gpu-1:99999/v1", "Port out of range"),
        ("http://gpu-1:eighty/v1", "Port could not be cast"),
    ],
)
def test_an_api_base_that_does_not_parse_is_refused_at_its_key(api_base: str, reason: str) -> None:
    text = f'backends:\n  hosted: {{api_base: "{api_base}"}}\nmodels: []\n'
    with pytest.raises(ConfigError) as refused:
        parse_config(text, env={})
    assert "backends.hosted.api_base: expected a http/https URL" in str(refused.value)
    assert reason in str(refused.value)


def _alias_bomb(levels: int) -> str:
    """litellm_params holding `levels` levels of aliases, each to ten of the level below."""
    lines = ["  hosted:", "    type: litellm", "    litellm_params:", "      l0: &l0 [x, y]"]
    for level in range(1, levels + 1):
        refs = ", ".join([f"*l{level - 1}"] * 10)
        lines.append(f"      l{level}: &l{level} [{refs}]")
    lines.append('  vllm: {api_base: "http://127.0.0.1:8000/v1"}')
    return "backends:\n" + "\n".join(lines) + "\nmodels: []\n"


def test_aliases_of_aliases_in_litellm_params_load_once_each() -> None:
    """Each level read once: three levels of ten-fold aliases, within the alias bound
    (tests/config/test_config_alias_bombs.py refuses 25 of them)."""
    config = parse_config(_alias_bomb(3), env={})
    params = config.backends["hosted"].litellm_params
    assert len(params["l3"]) == 10  # type: ignore[arg-type]
    assert params["l1"][0] == ["x", "y"]  # type: ignore[index]
