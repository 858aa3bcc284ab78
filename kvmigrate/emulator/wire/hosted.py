"""OpenAI's hosted API dialect."""

from __future__ import annotations

import hashlib
import random

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.outputs import Choice, Generation
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.wire.base import JSON, Dialect


class HostedDialect(Dialect):
    """OpenAI's API as `api.openai.com` sends it."""

    def __init__(self, settings: EmulatorSettings, rng: random.Random) -> None:
        super().__init__(settings, rng)
        digest = hashlib.blake2b(settings.instance_name.encode(), digest_size=5).hexdigest()
        self.fingerprint = f"fp_{digest}"

    def chat_id(self) -> str:
        return f"chatcmpl-{self.alnum(29)}"

    def completion_id(self) -> str:
        return f"cmpl-{self.alnum(29)}"

    def tool_call_id(self) -> str:
        return f"call_{self.alnum(24)}"

    def error_body(self, error: EmulatorError) -> JSON:
        default_type = "invalid_request_error"
        if error.status == 429:
            default_type = "requests"
        elif error.status >= 500:
            default_type = "server_error"
        return {
            "error": {
                "message": error.message,
                "type": error.error_type or default_type,
                "param": error.param,
                "code": error.code,
            }
        }

    def usage(self, gen: Generation, *, detailed: bool = True) -> JSON:
        usage: JSON = {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        }
        if detailed:
            usage["prompt_tokens_details"] = {"cached_tokens": gen.cached_tokens, "audio_tokens": 0}
            usage["completion_tokens_details"] = {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            }
        return usage

    def message(self, choice: Choice) -> JSON:
        message: JSON = {"role": "assistant", "content": choice.text or None}
        if choice.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in choice.tool_calls
            ]
        else:
            message["content"] = choice.text
        message["refusal"] = None
        message["annotations"] = []
        return message

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
                }
                for c in gen.choices
            ],
            "usage": self.usage(gen),
            "service_tier": "default",
            "system_fingerprint": self.fingerprint,
        }

    def completion(self, gen: Generation) -> JSON:
        return {
            "id": gen.id,
            "object": "text_completion",
            "created": gen.created,
            "model": gen.model,
            "choices": [
                self._text_choice(c.index, c.text, c.finish_reason, c.stop_reason)
                for c in gen.choices
            ],
            "usage": self.usage(gen, detailed=False),
        }

    def embeddings(self, model: str, data: list[JSON], prompt_tokens: int) -> JSON:
        return {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }

    def model_list(self) -> JSON:
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": 1721172741, "owned_by": "system"}
                for m in self.settings.served_models
            ],
        }

    def _chunk(self, gen: Generation, choices: list[JSON], include_usage: bool) -> JSON:
        chunk: JSON = {
            "id": gen.id,
            "object": "chat.completion.chunk",
            "created": gen.created,
            "model": gen.model,
            "service_tier": "default",
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if include_usage:
            chunk["usage"] = None
        # OpenAI pads chunks with random characters against length side channels.
        chunk["obfuscation"] = self.alnum(self._rng.randint(1, 12))
        return chunk

    def _role_delta(self, choice: Choice) -> JSON:
        content = None if choice.tool_calls else ""
        return {"role": "assistant", "content": content, "refusal": None}

    def _finish(self, choice: Choice, delta_key: str) -> JSON:
        if delta_key == "text":
            return self._text_choice(choice.index, "", choice.finish_reason, None)
        return {
            "index": choice.index,
            "delta": {},
            "logprobs": None,
            "finish_reason": choice.finish_reason,
        }

    def _usage_chunk(self, gen: Generation, obj: str, detailed: bool) -> JSON:
        chunk = self._chunk(gen, [], True) if obj.startswith("chat") else None
        if chunk is None:
            chunk = self._completion_chunk(gen, [], True)
        chunk["usage"] = self.usage(gen, detailed=detailed)
        return chunk
