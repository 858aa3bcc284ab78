"""Anthropic's hosted API dialect: `msg_01...` and `toolu_01...` ids, its error envelope
(`{"type": "error", "error": {...}, "request_id": ...}`) and its model list. The Messages
bodies and events themselves are rendered by emulator.messages_api."""

from __future__ import annotations

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.wire.base import JSON
from kvmigrate.emulator.wire.hosted import HostedDialect
from kvmigrate.wire.anthropic import error_type


class AnthropicDialect(HostedDialect):
    def chat_id(self) -> str:
        return "msg_01" + self.alnum(22)

    def tool_call_id(self) -> str:
        return "toolu_01" + self.alnum(22)

    def error_body(self, error: EmulatorError) -> JSON:
        return {
            "type": "error",
            "error": {
                "type": error.error_type or error_type(error.status),
                "message": error.message,
            },
            "request_id": "req_011" + self.alnum(21),
        }

    def model_list(self) -> JSON:
        models = self.settings.served_models
        data = [
            {
                "type": "model",
                "id": model,
                "display_name": model,
                "created_at": "2025-09-29T00:00:00Z",
            }
            for model in models
        ]
        return {
            "data": data,
            "has_more": False,
            "first_id": models[0] if models else None,
            "last_id": models[-1] if models else None,
        }
