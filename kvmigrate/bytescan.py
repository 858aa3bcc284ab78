"""Finding a short byte string in a request body at memory speed.

An agent resends its whole history every turn, so the proxy's loop scans bodies of 100 KB
and more for a few spellings (`"model"` twice? an escaped letter? `"tools"`?). CPython
3.11's `bytes.find` searches a short needle in a long haystack at about 1-2 GB/s (its
skip loop and two-way search); the C library's `memmem` at 8 GB/s or more. On a 113 KB
body the proxy's three scans took about 130 us of a forwarded request's 850
(`benchmarks/duplicate_key_scan.py`).

Below `FOREIGN_FROM` bytes a foreign call costs more than it saves, and where the C library
has no `memmem` (Windows) every scan is `bytes.find`.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

FOREIGN_FROM = 4096

# memmem(haystack, haystack_len, needle, needle_len) -> the first match's address or NULL
MemMem = Callable[[int, int, bytes, int], "int | None"]


@functools.cache
def _memmem() -> MemMem | None:
    """The C library's memmem, looked up once (the process's own symbols: no search for a
    library file, which would start a subprocess); None where there is none."""
    try:
        function = ctypes.CDLL(None).memmem
    except (OSError, AttributeError, TypeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return function


def find(haystack: bytes, needle: bytes, start: int = 0) -> int:
    """`haystack.find(needle, start)`, at memory speed for a long haystack."""
    rest = len(haystack) - start
    memmem = _memmem() if rest >= FOREIGN_FROM and needle and start >= 0 else None
    if memmem is None or type(haystack) is not bytes:
        return haystack.find(needle, start)
    # The address of the bytes' own buffer: nothing is copied, and `haystack` is held
    # (this frame's argument) for as long as memmem reads it.
    base = ctypes.cast(ctypes.c_char_p(haystack), ctypes.c_void_p).value
    assert base is not None
    found = memmem(base + start, rest, needle, len(needle))
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
