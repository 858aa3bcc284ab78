"""The C library, called through ctypes: what kvmigrate needs of it that Python does not offer.

  - `memmem`, to find a short byte string in a long request body at memory speed
    (kvmigrate.bytescan): CPython 3.11's `bytes.find` is several times slower there than
    the vectorised memmem, on the duplicate-key check of every agent body
    (benchmarks/duplicate_key_scan.py measures both; docs/performance-history.md keeps the
    figures).
  - `prctl(PR_SET_PDEATHSIG)`, so the kernel kills a worker whose parent died
    (kvmigrate.background): Python has no binding for it.
Both are looked up among the process's own symbols (`CDLL(None)`: no search for a library
file, which would start a subprocess). Each is listed in `PRIVATE_NAMES` with what needs it,
and called only here.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable

LIBRARY = "libc"

PRIVATE_NAMES: dict[str, str] = {
    "memmem": "the C library's memmem(haystack, haystack_len, needle, needle_len), by its "
    "address in the process: bytescan.find's search of long bodies (a GNU and BSD "
    "extension; where it is missing every scan is bytes.find)",
    "prctl": "Linux's prctl(PR_SET_PDEATHSIG, signal): a recorder or detector worker is "
    "killed by the kernel when its proxy dies (background.WorkerProcess)",
}

# memmem(haystack, haystack_len, needle, needle_len) -> the first match's address or NULL
MemMem = Callable[[int, int, bytes, int], "int | None"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@functools.cache
def memmem() -> MemMem | None:
    """The C library's memmem, looked up once; None where there is none (Windows)."""
    try:
        function = ctypes.CDLL(None).memmem
    except (OSError, AttributeError, TypeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)
    return function


def bytes_address(data: bytes) -> int:
    """The address of a `bytes` object's own buffer: nothing copied (CPython passes a bytes
    object to a `c_char_p` as a pointer into it). Valid while `data` is held."""
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert address is not None
    return address


def set_parent_death_signal(signum: int) -> None:
    """Ask Linux to send `signum` to this process when its parent dies; nothing elsewhere,
    or where the call fails."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        return
