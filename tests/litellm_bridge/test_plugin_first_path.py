"""The plugin's first import path, `kvmigrate.integrations.litellm_plugin`, which LiteLLM
configs written before the plugin moved name: it gives the very plugin of its own path,
`kvmigrate.litellm_bridge.plugin`, whichever path is read first. Without LiteLLM (a real
LiteLLM loads it by this path in test_litellm_plugin_attempts.py)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from kvmigrate.litellm_bridge import plugin

FIRST = "kvmigrate.integrations.litellm_plugin"
NOW = "kvmigrate.litellm_bridge.plugin"


def _loaded(callback: str) -> object:
    """A callback as LiteLLM's proxy loads one: the module by its dotted path, then the
    attribute."""
    module, _, name = callback.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "kvmigrate.yaml"
    path.write_text(
        f"""
backends:
  hosted: {{api_base: "http://127.0.0.1:1/v1"}}
  vllm: {{api_base: "http://127.0.0.1:2/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: vllm-llama}}
rollout: {{mode: split, percent: 30, state: "sqlite:///{tmp_path}/state.db"}}
record: {{enabled: false}}
"""
    )
    monkeypatch.setenv("KVMIGRATE_CONFIG", str(path))
    # No plugin made before the test, and none left after it.
    monkeypatch.setattr(plugin, "_instance", None)
    return path


@pytest.mark.parametrize("first", [FIRST, NOW], ids=["first-path-first", "new-path-first"])
def test_both_paths_give_one_plugin(config_path: Path, first: str) -> None:
    second = NOW if first == FIRST else FIRST
    made = _loaded(f"{first}.proxy_handler_instance")
    try:
        assert _loaded(f"{second}.proxy_handler_instance") is made
        assert isinstance(made, plugin.KvmigrateRouter)
        # Made from $KVMIGRATE_CONFIG, once.
        assert made.config.rollout.percent == 30
        assert made.config.record.enabled is False
        assert made.store.read().percent == 30  # the store it opened
    finally:
        assert isinstance(made, plugin.KvmigrateRouter)
        made.close()


def test_the_first_path_reads_every_name_of_the_plugin() -> None:
    first: ModuleType = importlib.import_module(FIRST)
    assert first.KvmigrateRouter is plugin.KvmigrateRouter
    assert first.from_env is plugin.from_env
    assert first.GENERATION_HEADER == "x-kvmigrate-rollout-generation"
    assert first.CONFIG_ENV_VAR == "KVMIGRATE_CONFIG"
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        _ = first.no_such_name
