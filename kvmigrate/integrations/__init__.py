"""Integrations with other LLM gateways: the LiteLLM proxy plugin (the `litellm` extra).

Nothing here imports litellm at package import time: kvmigrate installs and type-checks
without it, and only `kvmigrate.integrations.litellm_plugin`, loaded by LiteLLM's proxy,
needs it.
"""
