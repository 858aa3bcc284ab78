"""The wire dialects: OpenAI's hosted API and vLLM's OpenAI-compatible server.

Both speak the same API; they differ field by field, and a parity checker must see those
differences (see shared/notes/wire-formats.md):

- hosted: `chatcmpl-<29 alnum>` ids, `call_<24 alnum>` tool ids, a `system_fingerprint`,
  `service_tier`, `message.refusal`/`annotations`, detailed usage, `usage: null` on every
  chunk when usage is requested, string error codes.
- vllm: hex ids, `chatcmpl-tool-<32 hex>` tool ids, null fingerprint and tier,
  `choices[].stop_reason`, `prompt_logprobs`/`kv_transfer_params`, usage with optional
  `prompt_tokens_details`, no usage key on ordinary chunks, numeric error codes and a flat
  `{"error": "Unauthorized"}` for a bad key.
"""

from __future__ import annotations

import random

from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.wire.anthropic import AnthropicDialect
from kvmigrate.emulator.wire.base import JSON, Dialect, Step
from kvmigrate.emulator.wire.hosted import HostedDialect
from kvmigrate.emulator.wire.vllm import VllmDialect

__all__ = [
    "JSON",
    "AnthropicDialect",
    "Dialect",
    "HostedDialect",
    "Step",
    "VllmDialect",
    "make_dialect",
]


def make_dialect(settings: EmulatorSettings, rng: random.Random) -> Dialect:
    if settings.profile == "hosted":
        return HostedDialect(settings, rng)
    if settings.profile == "anthropic":
        return AnthropicDialect(settings, rng)
    return VllmDialect(settings, rng)
