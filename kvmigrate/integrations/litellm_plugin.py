"""The LiteLLM plugin's first import path, kept for LiteLLM configs that name it:

    litellm_settings:
      callbacks: kvmigrate.integrations.litellm_plugin.proxy_handler_instance

loads the same plugin as `kvmigrate.litellm_bridge.plugin.proxy_handler_instance`, where it
lives now (the same object: the plugin is made once, on first access, from either path).
Every other name of the plugin module reads through here too.
"""

from __future__ import annotations

from typing import Any

from kvmigrate.litellm_bridge import plugin


def __getattr__(name: str) -> Any:
    # Read on each access, not copied at import: `proxy_handler_instance` is made by the
    # plugin module on first access, and must be its one instance.
    return getattr(plugin, name)
