"""The doctor's view of an endpoint: raw status codes, JSON bodies and Prometheus counters.

Raw HTTP rather than the openai client, because the checks read what the SDK hides: the
exact 400 message vLLM gives without a chat template or a tool parser, `max_model_len` on
the model card, and `/metrics` beside `/v1`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from kvmigrate.capped_body import read_capped


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: Any  # parsed JSON, or None
    text: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error_message(self) -> str:
        """The message of an OpenAI/vLLM error envelope (nested or flat), else the raw text."""
        body = self.body
        if isinstance(body, dict):
            error = body.get("error", body)
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return str(error["message"])
            if isinstance(error, str):
                return error
        return self.text[:300]


class Endpoint:
    """An OpenAI-compatible base URL (ending in /v1) and its server root."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Endpoint:
        self._session = aiohttp.ClientSession(timeout=self._timeout, headers=self._headers)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, url: str, body: Any = None) -> Reply:
        assert self._session is not None, "use `async with Endpoint(...)`"
        async with self._session.request(method, url, json=body) as response:
            text = (await read_capped(response)).decode("utf-8", errors="replace")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        return Reply(response.status, parsed, text)

    async def get(self, path: str) -> Reply:
        return await self._request("GET", f"{self.base_url}/{path}")

    async def post(self, path: str, body: dict[str, Any]) -> Reply:
        return await self._request("POST", f"{self.base_url}/{path}", body)

    async def counters(self) -> dict[str, float] | None:
        """Prometheus samples at the root's /metrics, summed over labels; None if absent."""
        try:
            reply = await self._request("GET", f"{self.root_url}/metrics")
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None
        if not reply.ok:
            return None
        totals: dict[str, float] = {}
        for line in reply.text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                value = float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            totals[name] = totals.get(name, 0.0) + value
        return totals
