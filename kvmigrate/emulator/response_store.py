"""Stored responses, so `previous_response_id` continues a chain on the backend that answered
it, as OpenAI and vLLM (with `VLLM_ENABLE_RESPONSES_API_STORE=1`) do. Each backend has its
own: an id another backend issued is unknown here, a 404 `invalid_request_error`.
"""

from __future__ import annotations

from collections import OrderedDict

from kvmigrate.emulator.errors import EmulatorError
from kvmigrate.emulator.wire import JSON

MAX_STORED = 100_000


def not_found(response_id: str) -> EmulatorError:
    return EmulatorError(
        404,
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        error_type="invalid_request_error",
        vllm_message=f"Response with id '{response_id}' not found.",
    )


class ResponseStore:
    """Each stored response's whole conversation (its input history and its answer) as chat
    messages, its response object and its input items (kvmigrate.emulator.input_items),
    bounded, oldest evicted first."""

    def __init__(self, enabled: bool = True, capacity: int = MAX_STORED) -> None:
        self.enabled = enabled
        self.capacity = capacity
        self._messages: OrderedDict[str, tuple[list[JSON], JSON, list[JSON]]] = OrderedDict()

    def history(self, response_id: str) -> list[JSON]:
        """The conversation up to and including `response_id`'s answer."""
        return self._stored(response_id)[0]

    def response(self, response_id: str) -> JSON:
        """The response object, as `GET /v1/responses/{id}` returns it."""
        return self._stored(response_id)[1]

    def input_items(self, response_id: str) -> list[JSON]:
        """The items `response_id` was answered from, oldest first."""
        return self._stored(response_id)[2]

    def context(self, response_id: str | None) -> list[JSON]:
        """What a response continuing `response_id` is answered from before its own input:
        that response's input items and its output (none for a first turn)."""
        if response_id is None or not self.enabled:
            return []
        _, response, items = self._stored(response_id)
        output = response.get("output")
        return [*items, *(output if isinstance(output, list) else [])]

    def _stored(self, response_id: str) -> tuple[list[JSON], JSON, list[JSON]]:
        stored = self._messages.get(response_id) if self.enabled else None
        if stored is None:
            raise not_found(response_id)
        return stored

    def keep(
        self, response_id: str, messages: list[JSON], response: JSON, items: list[JSON]
    ) -> None:
        if not self.enabled:
            return
        self._messages[response_id] = (messages, response, items)
        if len(self._messages) > self.capacity:
            self._messages.popitem(last=False)
