"""`kvmigrate.bytescan` finds what `bytes.find` finds, at memory speed past `FOREIGN_FROM`."""

from __future__ import annotations

import pytest

from kvmigrate import bytescan

LONG = b"".join(b'{"role":"user","content":"turn %d \\u001b[31m"},' % i for i in range(2000))
NEEDLES = [b'"model"', b"\\u00", b"\\u001b", b"turn 1999", b"x", b"}", LONG[-7:], b'"tools"']


@pytest.mark.parametrize("needle", NEEDLES)
@pytest.mark.parametrize(
    "size", [0, 10, bytescan.FOREIGN_FROM - 1, bytescan.FOREIGN_FROM, len(LONG)]
)
def test_find_agrees_with_bytes_find(needle: bytes, size: int) -> None:
    haystack = LONG[:size]
    for start in (0, 1, 500, size // 2, size - len(needle), size - 1, size, size + 10, -5):
        assert bytescan.find(haystack, needle, start) == haystack.find(needle, start), start
    assert bytescan.contains(haystack, needle) == (needle in haystack)


@pytest.mark.parametrize(
    ("haystack", "once", "first"),
    [
        (LONG + b'"model"', True, len(LONG)),
        (b'"model"' + LONG + b'"model"', False, 0),
        (LONG[:5000] + b'"model""model"' + LONG[:5000], False, 5000),
        (LONG, True, -1),
        (b'"model"', True, 0),
    ],
)
def test_spelled_once(haystack: bytes, once: bool, first: int) -> None:
    assert bytescan.spelled_once(haystack, b'"model"') == (once, first)


def test_a_bytes_subclass_or_bytearray_is_searched_as_bytes_searches_it() -> None:
    class Body(bytes):
        pass

    for haystack in (Body(LONG), bytearray(LONG)):
        assert bytescan.find(haystack, b"turn 1999") == LONG.find(b"turn 1999")  # type: ignore[arg-type]
