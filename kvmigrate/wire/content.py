"""A message's `content` as text, the one reading every part of kvmigrate shares.

Chat, Responses and Messages content is a string or a list of parts; a text part is a bare
string or an object with a string `text`. What a media part (an image, a file, audio) reads
as differs by purpose, so the caller says: nothing (comparing answers), its kind (identity),
a digest of it (a prefix-cache fingerprint, where a changed image breaks reuse as text does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def content_text(content: Any, media: Callable[[Any], str] | None = None, sep: str = "") -> str:
    """String content as is; a list's text parts joined by `sep`, with each other part as
    `media(part)` (left out without `media`); anything else (null, a number) empty."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif media is not None:
            texts.append(media(part))
    return sep.join(texts)


def media_kind(part: Any) -> str:
    """A media part as its kind, `<image_url>`: that an image is there counts, not its bytes."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    return f"<{kind}>" if kind else ""
