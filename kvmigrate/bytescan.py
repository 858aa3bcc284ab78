"""Finding a short byte string in a request body at memory speed.

An agent resends its whole history every turn, so the proxy's loop scans bodies of 100 KB
and more for a few spellings (`"model"` twice? an escaped letter? `"tools"`?). CPython
3.11's `bytes.find` searches a short needle in a long haystack with a skip loop and a
two-way search; the C library's `memmem` is vectorised and several times faster, and the
scans were a visible share of what the proxy adds to a forwarded agent turn
(`benchmarks/duplicate_key_scan.py` measures both, in one run).

Below `FOREIGN_FROM` bytes a foreign call costs more than it saves, and where the C library
has no `memmem` (Windows) every scan is `bytes.find`.
"""

from __future__ import annotations

from kvmigrate.vendor_internals.libc import bytes_address, memmem

FOREIGN_FROM = 4096


def find(haystack: bytes, needle: bytes, start: int = 0) -> int:
    """`haystack.find(needle, start)`, at memory speed for a long haystack."""
    rest = len(haystack) - start
    search = memmem() if rest >= FOREIGN_FROM and needle and start >= 0 else None
    if search is None or type(haystack) is not bytes:
        return haystack.find(needle, start)
    # `haystack` is held (this frame's argument) for as long as memmem reads its buffer.
    base = bytes_address(haystack)
    found = search(base + start, rest, needle, len(needle))
    return -1 if found is None else found - base


def contains(haystack: bytes, needle: bytes) -> bool:
    """`needle in haystack`, at memory speed for a long haystack."""
    return find(haystack, needle) >= 0


def spelled_once(haystack: bytes, needle: bytes) -> tuple[bool, int]:
    """(whether `needle` occurs at most once, where it first does or -1): one pass in all,
    the second search starting after the first match."""
    first = find(haystack, needle)
    if first < 0:
        return True, -1
    return find(haystack, needle, first + 1) < 0, first
