"""An HTTP answer's body read with a ceiling, for the CLI's own calls (doctor, parity): a
server that streams an endless body must end as that call's error, not fill memory."""

from __future__ import annotations

import aiohttp

from kvmigrate.config.secret import safe_url

# The most of one answer a CLI call reads. vLLM's largest is /metrics, well under a MiB.
MAX_BODY_BYTES = 16 * 1024 * 1024


class BodyTooLarge(aiohttp.ClientPayloadError):
    """An answer longer than the cap: a ClientError, so callers report it as a failed call."""


async def read_capped(response: aiohttp.ClientResponse, limit: int = MAX_BODY_BYTES) -> bytes:
    """The body, or BodyTooLarge once it passes `limit` bytes (nothing more is buffered)."""
    body = bytearray()
    while chunk := await response.content.read(64 * 1024):
        body += chunk
        if len(body) > limit:
            where = safe_url(str(response.url))
            raise BodyTooLarge(f"{where} answered more than {limit:,} bytes")
    return bytes(body)
