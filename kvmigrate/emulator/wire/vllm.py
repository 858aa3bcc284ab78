"""vLLM's OpenAI-compatible server dialect."""

from __future__ import annotations

import random
import time
from http import HTTPStatus

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.outputs import Choice, Generation
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.wire.base import JSON, Dialect


class VllmDialect(Dialect):
    """vLLM's OpenAI-compatible server (v0.10.1 and later: nested error envelope)."""

    def __init__(self, settings: EmulatorSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        self._started = int(time.time())

    def chat_id(self) -> str:
        return f"chatcmpl-{self.hex(32)}"

    def completion_id(self) -> str:
        return f"cmpl-{self.hex(32)}"

    def tool_call_id(self) -> str:
        return f"chatcmpl-tool-{self.hex(32)}"

    def error_body(self, error: EmulatorError) -> JSON:
        if error.status == 401:
            return {"error": "Unauthorized"}
        phrase = HTTPStatus(error.status).phrase.replace(" ", "").replace("-", "")
        return {
            "error": {
                "message": error.vllm_message or error.message,
                "type": error.error_type or f"{phrase}Error",
                "param": None,
                "code": error.status,
            }
        }

    def usage(self, gen: Generation, *, detailed: bool = True) -> JSON:
        details = None
        if self.settings.prompt_tokens_details:
            details = {"cached_tokens": gen.cached_tokens}
        return {
            "prompt_tokens": gen.prompt_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            "completion_tokens": gen.completion_tokens,
            "prompt_tokens_details": details,
        }

    def message(self, choice: Choice) -> JSON:
        return {
            "role": "assistant",
            "content": None if choice.tool_calls else choice.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in choice.tool_calls
            ],
            "reasoning_content": None,
        }

    def chat_completion(self, gen: Generation) -> JSON:
        return {
            "id": gen.id,
            "object": "chat.completion",
            "created": gen.created,
            "model": gen.model,
            "choices": [
                {
                    "index": c.index,
                    "message": self.message(c),
                    "logprobs": None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
                for c in gen.choices
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self.usage(gen),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }

    def completion(self, gen: Generation) -> JSON:
        choices = []
        for c in gen.choices:
            choice = self._text_choice(c.index, c.text, c.finish_reason, c.stop_reason)
            choice["prompt_logprobs"] = None
            choices.append(choice)
        return {
            "id": gen.id,
            "object": "text_completion",
            "created": gen.created,
            "model": gen.model,
            "choices": choices,
            "service_tier": None,
            "system_fingerprint": None,
            "usage": self.usage(gen),
            "kv_transfer_params": None,
        }

    def embeddings(self, model: str, data: list[JSON], prompt_tokens: int) -> JSON:
        return {
            "id": f"embd-{self.hex(32)}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }

    def model_list(self) -> JSON:
        return {"object": "list", "data": [self._card(m) for m in self.settings.served_models]}

    def _card(self, model: str) -> JSON:
        permission = {
            "id": f"modelperm-{self.hex(32)}",
            "object": "model_permission",
            "created": self._started,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": model,
            "object": "model",
            "created": self._started,
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": self.settings.context_limit,
            "permission": [permission],
        }

    def _text_choice(
        self, index: int, text: str, finish_reason: str | None, stop_reason: str | None
    ) -> JSON:
        choice = super()._text_choice(index, text, finish_reason, stop_reason)
        choice["stop_reason"] = stop_reason
        return choice

    def _completion_chunk(self, gen: Generation, choices: list[JSON], include_usage: bool) -> JSON:
        return super()._completion_chunk(gen, choices, False)

    def _chunk(self, gen: Generation, choices: list[JSON], include_usage: bool) -> JSON:
        return {
            "id": gen.id,
            "object": "chat.completion.chunk",
            "created": gen.created,
            "model": gen.model,
            "choices": choices,
        }

    def _role_delta(self, choice: Choice) -> JSON:
        return {"role": "assistant", "content": ""}

    def _finish(self, choice: Choice, delta_key: str) -> JSON:
        if delta_key == "text":
            return self._text_choice(choice.index, "", choice.finish_reason, choice.stop_reason)
        return {
            "index": choice.index,
            "delta": {"content": ""},
            "logprobs": None,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }

    def _usage_chunk(self, gen: Generation, obj: str, detailed: bool) -> JSON:
        return {
            "id": gen.id,
            "object": obj,
            "created": gen.created,
            "model": gen.model,
            "choices": [],
            "usage": self.usage(gen),
        }
