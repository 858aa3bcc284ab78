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
# How much of the body one call into zlib is given.
IN_SLICE = 64 * 1024
# Gzip members one body may hold (`cat a.gz b.gz` makes two).
MAX_MEMBERS = 64


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
    """One body's inflation, resumable: `run` goes on where the last call stopped.

    zlib is fed the body a slice at a time, and a gzip body may hold at most `MAX_MEMBERS`
    members: at each member's end zlib copies whatever input it was given past it, so a
    body of thousands of empty members fed whole cost the square of its size."""

    __slots__ = (
        "_coding", "_data", "_limit", "_members", "_offset", "_parts", "_pending", "_size",
        "_stream",
    )  # fmt: skip

    def __init__(self, coding: str, data: bytes, limit: int) -> None:
        self._coding = coding
        self._limit = limit
        self._stream = zlib.decompressobj(_wbits(coding, data))
        self._data = memoryview(data)
        self._offset = 0
        self._pending: bytes | memoryview = b""
        self._members = 1
        self._parts: list[bytes] = []
        self._size = 0

    def run(self, budget: int | None) -> bytes | None:
        """Inflate on until the body ends (its bytes, joined) or, with a `budget`, until
        that much more output came out, or a second member began (None: call again)."""
        left = budget
        while True:
            if not self._pending:
                self._pending = self._data[self._offset : self._offset + IN_SLICE]
                self._offset += len(self._pending)
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
                if left is not None:
                    return None  # several members: the rest is a thread's work
            elif not out and not self._pending and self._offset >= len(self._data):
                raise undecodable()  # every byte read, and the stream did not end
            if left is not None:
                left -= len(out)
                if left <= 0:
                    return None

    def _next_member(self) -> bool:
        """After a stream's end: a gzip body may hold several members, one after another
        (what `cat a.gz b.gz` makes); any other bytes after the end are no part of it."""
        rest = self._stream.unused_data or self._data[self._offset : self._offset + IN_SLICE]
        if not rest:
            return False
        if self._coding == "deflate" or bytes(rest[:2]) != b"\x1f\x8b":
            raise undecodable()
        if self._members >= MAX_MEMBERS:
            raise bad_request(
                f"The request body holds more than {MAX_MEMBERS} gzip members: join them into one."
            )
        self._members += 1
        if not self._stream.unused_data:
            self._offset += len(rest)
        self._stream = zlib.decompressobj(_GZIP_WBITS)
        self._pending = rest
        return True
