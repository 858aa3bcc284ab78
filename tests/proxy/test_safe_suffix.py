"""`safe_suffix` refuses every path trick that could reach another path or host than the
configured base, one table row per trick, and lets an ordinary path through unchanged."""

from __future__ import annotations

import pytest

from kvmigrate.proxy.errors import ProxyError
from kvmigrate.proxy.upstream import safe_suffix


@pytest.mark.parametrize(
    "suffix",
    [
        "files/../admin",  # a parent segment
        "files/./x",  # a current segment
        "files//x",  # an empty segment: //host on some joiners
        "files\\x",  # a backslash some servers read as a slash
        "files/%2F/x",  # an encoded slash, encoded twice (aiohttp decoded once)
        "files/%5c/x",  # an encoded backslash
        "files/%2e%2e/x",  # encoded dots
        "http://evil.example.com/x",  # a scheme
        "x@evil.example.com/y",  # userinfo: the host after the @
        "@evil.example.com",
        "/etc/passwd",  # a second leading slash
    ],
)
def test_a_path_trick_is_a_400_naming_the_path(suffix: str) -> None:
    with pytest.raises(ProxyError) as refused:
        safe_suffix(suffix)
    assert refused.value.status == 400
    assert str(refused.value) == f"Unsupported path: /v1/{suffix}"


@pytest.mark.parametrize(
    "suffix", ["moderations", "files/file-abc123/content", "vector_stores/vs_1/files", "a.b/c-d_e"]
)
def test_an_ordinary_path_passes_unchanged(suffix: str) -> None:
    assert safe_suffix(suffix) == suffix
