"""A client's compressed request body: `Content-Encoding: gzip` (or `x-gzip`) and `deflate`.

aiohttp's parser would inflate such a body itself, on the event loop, as its bytes arrive:
before any handler has checked a key, and past `server.max_body_bytes` (deflate packs a
run of zeros a thousandfold). The proxy's server is built without that (`handler_args` in
`build_proxy_app`), and a route inflates the body here instead, once it has authenticated
the request and read the compressed bytes within the size and time limits: never more
than `server.max_body_bytes` of output (a 413 past it), in slices, with a thread doing
whatever a small body does not finish at once (zlib lets go of the GIL while it works).

There is no separate ratio cap: the output cap already bounds the work a body can cause
at what an uncompressed body of the limit costs, and a highly repetitive agent history
compresses far better than typical JSON, so any ratio low enough to matter would refuse
honest bodies. No SDK compresses its requests; a gateway in front of the proxy may.
Any other coding (br, zstd, compress, several codings in a row) is refused with a 415.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping

from kvmigrate.proxy.errors import ProxyError, bad_request, body_too_large

# The codings a body may come in, each to zlib's `wbits` for it (deflate: see `_wbits`).
_GZIP_WBITS = 16 + zlib.MAX_WBITS
CODINGS = {"gzip": _GZIP_WBITS, "x-gzip": _GZIP_WBITS, "deflate": zlib.MAX_WBITS}
SUPPORTED_TEXT = "identity (uncompressed), gzip (or x-gzip) or deflate"
# What a body may inflate to on the event loop: a typical compressed request ends within
# it, with no thread hop; the rest of a larger one is inflated on a worker thread.
INLINE_OUTPUT = 256 * 1024
# How much one call into zlib may produce: the output cap is checked between slices.
SLICE = 1024 * 1024


def unsupported_coding() -> ProxyError:
    # The header's value is not repeated: the message says what is accepted instead.
    return ProxyError(
        415,
        "This Content-Encoding is not supported for request bodies: send the body as "
        f"{SUPPORTED_TEXT}, with one coding at most.",
        "invalid_request_error",
        "unsupported_content_encoding",
    )


def undecodable() -> ProxyError:
    return bad_request(
        "The request body could not be decoded: check that it matches its "
        "Content-Encoding and Transfer-Encoding headers."
    )


def body_coding(headers: Mapping[str, str]) -> str | None:
    """The body's coding when it must be inflated (a key of `CODINGS`), None when it comes
    as it is (no Content-Encoding, or `identity`). Raises the 415 for any other: checked
    before a byte of the body is read."""
    value = headers.get("Content-Encoding")
    if value is None:
        return None
    codings = [c for c in (part.strip().lower() for part in value.split(",")) if c]
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in CODINGS:
        raise unsupported_coding()
    return codings[0]


async def inflate(data: bytes, coding: str, limit: int) -> bytes:
    """`data` inflated: at most `INLINE_OUTPUT` on the loop, the rest on a worker thread.
    Raises the 413 past `limit` bytes of output, and a 400 for a stream that is broken,
    cut short, or followed by bytes that are none of it."""
    if not data:
        return data
    inflater = _Inflater(coding, data, limit)
    body = inflater.run(INLINE_OUTPUT)
    if body is None:
        body = await asyncio.to_thread(inflater.run, None)
        assert body is not None
    return body


def _wbits(coding: str, data: bytes) -> int:
    """`deflate` is meant to be a zlib stream (RFC 9110), but some clients send the raw
    deflate data without its header, as aiohttp and browsers accept too."""
    wbits = CODINGS[coding]
    if coding == "deflate" and not _zlib_header(data):
        return -zlib.MAX_WBITS
    return wbits


def _zlib_header(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


class _Inflater:
    """One body's inflation, resumable: `run` goes on where the last call stopped."""

    __slots__ = ("_coding", "_limit", "_parts", "_pending", "_size", "_stream")

    def __init__(self, coding: str, data: bytes, limit: int) -> None:
        self._coding = coding
        self._limit = limit
        self._stream = zlib.decompressobj(_wbits(coding, data))
        self._pending = data
        self._parts: list[bytes] = []
        self._size = 0

    def run(self, budget: int | None) -> bytes | None:
        """Inflate on until the body ends (its bytes, joined) or, with a `budget`, until
        that much more output came out first (None: call again)."""
        left = budget
        while True:
            room = self._limit + 1 - self._size  # one byte past the limit proves it passed
            want = min(SLICE, room) if left is None else min(SLICE, room, left)
            try:
                out = self._stream.decompress(self._pending, want)
            except zlib.error:
                raise undecodable() from None
            self._pending = self._stream.unconsumed_tail
            if out:
                self._size += len(out)
                if self._size > self._limit:
                    raise body_too_large(self._limit)
                self._parts.append(out)
            if self._stream.eof:
                if not self._next_member():
                    return self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
            elif not out and not self._pending:
                raise undecodable()  # every byte read, and the stream did not end
            if left is not None:
                left -= len(out)
                if left <= 0:
                    return None

    def _next_member(self) -> bool:
        """After a stream's end: a gzip body may hold several members, one after another
        (what `cat a.gz b.gz` makes); any other bytes after the end are no part of it."""
        rest = self._stream.unused_data
        if not rest:
            return False
        if self._coding == "deflate" or rest[:2] != b"\x1f\x8b":
            raise undecodable()
        self._stream = zlib.decompressobj(_GZIP_WBITS)
        self._pending = rest
        return True
