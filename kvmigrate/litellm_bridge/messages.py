"""A `/v1/messages` answer as LiteLLM logs it, back in Anthropic's Messages shape.

LiteLLM's logging hooks get every Messages answer as a chat completion (`ModelResponse`),
whatever the client received. Non-streamed, the upstream's own body is beside it
(`original_response`) and is kept as it came; streamed, only the chat completion is, and
its text, tool calls, stop reason and token counts are written in Messages' shape, which is
what the recorder reads on this route (the copies, made through LiteLLM's router, come back
in that shape already).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

# Chat's finish reasons as Messages' stop reasons.
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def messages_answer(logged: Mapping[str, Any], chat: object) -> bytes:
    """The answer's bytes in Messages' shape: the upstream's body where LiteLLM kept it
    (`logged`: the logging kwargs), else `chat` (the logged chat completion) rewritten."""
    original = logged.get("original_response")
    if isinstance(original, str | bytes):
        raw = original.encode() if isinstance(original, str) else original
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if isinstance(body, dict) and body.get("type") == "message":
            return raw
    return orjson.dumps(from_chat(chat if isinstance(chat, Mapping) else {}), default=str)


def from_chat(chat: Mapping[str, Any]) -> dict[str, Any]:
    """A chat completion as a Messages answer."""
    choices = chat.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else {}
    message = choice.get("message") if isinstance(choice, Mapping) else None
    message = message if isinstance(message, Mapping) else {}
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            content.append(_tool_use(call, function))
    usage = chat.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    reason = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    return {
        "id": chat.get("id"),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model"),
        "content": content,
        "stop_reason": _STOP.get(reason, reason) if isinstance(reason, str) else None,
        "usage": {
            "input_tokens": usage.get("prompt_tokens"),
            "output_tokens": usage.get("completion_tokens"),
        },
    }


def _tool_use(call: Mapping[str, Any], function: Mapping[str, Any]) -> dict[str, Any]:
    arguments = function.get("arguments")
    try:
        parsed = orjson.loads(arguments) if isinstance(arguments, str) else arguments
    except orjson.JSONDecodeError:
        parsed = {"_raw": arguments}
    return {
        "type": "tool_use",
        "id": call.get("id"),
        "name": function.get("name"),
        "input": parsed if isinstance(parsed, dict) else {},
    }
