"""`wire.content.content_text`: the one reading of a message's content, with each caller's
media policy (dropped, its kind, a digest)."""

from __future__ import annotations

from typing import Any

import pytest

from kvmigrate.cachecheck.render import content_text as fingerprint_text
from kvmigrate.policies.continuity import text_of
from kvmigrate.wire.content import content_text, media_kind

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
OTHER_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,BBBB"}}


@pytest.mark.parametrize(
    ("content", "dropped", "kind"),
    [
        ("plain", "plain", "plain"),
        ("", "", ""),
        (None, "", ""),
        (42, "", ""),
        ({"text": "an object, not a list"}, "", ""),
        ([], "", ""),
        (["a", "b"], "ab", "ab"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "ab", "ab"),
        ([{"type": "text", "text": "see "}, IMAGE], "see ", "see <image_url>"),
        ([{"text": 7}, {"type": "input_file"}], "", "<input_file>"),
        ([{"no": "type"}, 3, None], "", ""),
    ],
)
def test_content_as_text(content: Any, dropped: str, kind: str) -> None:
    assert content_text(content) == dropped
    assert content_text(content, media_kind) == kind
    assert text_of(content) == kind  # identity counts a media part by its kind


def test_parts_join_with_the_separator_asked() -> None:
    assert content_text(["a", {"text": "b"}], sep="\n") == "a\nb"


def test_a_fingerprint_tells_two_images_apart_where_identity_does_not() -> None:
    one, other = (
        [{"type": "text", "text": "x"}, IMAGE],
        [{"type": "text", "text": "x"}, OTHER_IMAGE],
    )
    assert text_of(one) == text_of(other) == "x<image_url>"
    assert fingerprint_text(one) != fingerprint_text(other)
    assert fingerprint_text(one).startswith("x<|media:")
    assert fingerprint_text({"k": 1}) == '{"k": 1}'  # a non-list object, as a template's tojson
