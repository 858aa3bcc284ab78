"""What kvmigrate relies on of the C library, called through ctypes, still holds: memmem is
found and finds what `bytes.find` finds, a `bytes` object is passed by its own buffer (no
copy), and prctl sets the signal a worker gets when its parent dies. A failure names the
symbol and the kvmigrate feature that needs it
(kvmigrate/vendor_internals/libc.py)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys

import pytest

from kvmigrate.vendor_internals import libc
from kvmigrate.vendor_internals.libc import PRIVATE_NAMES

LINUX = sys.platform.startswith("linux")
HAYSTACK = b"".join(b'{"role":"user","content":"turn %d \\u001b"},' % i for i in range(500))


def moved(name: str, what: str) -> str:
    return (
        f"the C library ({sys.platform}): {what}. kvmigrate needs `{name}`: "
        f"{PRIVATE_NAMES[name]} (kvmigrate/vendor_internals/libc.py)"
    )


def test_every_symbol_has_a_contract() -> None:
    assert set(PRIVATE_NAMES) == {"memmem", "prctl"}


@pytest.mark.skipif(not LINUX, reason="glibc and musl have memmem; elsewhere bytes.find is used")
def test_memmem_is_found() -> None:
    assert libc.memmem() is not None, moved("memmem", "no memmem among the process's symbols")


@pytest.mark.parametrize(
    "needle", [b'"model"', b"turn 499", b"\\u00", HAYSTACK[:1], HAYSTACK[-9:], b"absent"]
)
def test_memmem_finds_what_bytes_find_finds(needle: bytes) -> None:
    search = libc.memmem()
    if search is None:
        pytest.skip("no memmem here")
    base = libc.bytes_address(HAYSTACK)
    for start in (0, 1, 100, len(HAYSTACK) // 2):
        found = search(base + start, len(HAYSTACK) - start, needle, len(needle))
        got = -1 if found is None else found - base
        assert got == HAYSTACK.find(needle, start), moved("memmem", f"{needle!r} from {start}")


def test_a_bytes_object_is_passed_by_its_own_buffer() -> None:
    """CPython hands a `bytes` to a `c_char_p` as a pointer into the object itself: nothing
    is copied, so the address stays valid while the bytes are held."""
    address = libc.bytes_address(HAYSTACK)
    assert address == id(HAYSTACK) + bytes.__basicsize__ - 1, moved(
        "memmem", "a bytes object's c_char_p no longer points into the object (a copy?)"
    )
    assert ctypes.string_at(address, len(HAYSTACK)) == HAYSTACK


_READ_BACK = """
import ctypes, signal
from kvmigrate.vendor_internals.libc import set_parent_death_signal
set_parent_death_signal(signal.SIGUSR1)
got = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(got), 0, 0, 0)  # PR_GET_PDEATHSIG
print(got.value)
"""


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux's")
def test_prctl_sets_the_parent_death_signal() -> None:
    run = subprocess.run(
        [sys.executable, "-c", _READ_BACK], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) == signal.SIGUSR1, moved("prctl", "PR_SET_PDEATHSIG did not take")
