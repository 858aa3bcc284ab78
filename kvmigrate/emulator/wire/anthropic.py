"""Anthropic's hosted API dialect: `msg_01...` and `toolu_01...` ids, its error envelope
(`{"type": "error", "error": {...}, "request_id": ...}`) and its model list. The Messages
bodies and events themselves are rendered by emulator.messages_api."""

from __future__ import annotations

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.wire.base import JSON
from kvmigrate.emulator.wire.hosted import HostedDialect
from kvmigrate.wire.anthropic import anthropic_model_list, error_type


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
        return anthropic_model_list(list(self.settings.served_models))
