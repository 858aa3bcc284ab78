"""Implementations chosen by a URL's scheme, imported only when a URL names one.

A store factory (`recorder.store`, `rollout.store`) defines the interface its
implementations build on, so it cannot import them as it loads: it names each one as
`"module:attribute"` by scheme, and this imports the one a URL asks for.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def url_scheme(url: str) -> str:
    """`sqlite` for `sqlite:///x.db`; empty for a URL without `://`."""
    return url.split("://", 1)[0] if "://" in url else ""


def implementation(url: str, by_scheme: Mapping[str, str]) -> Any:
    """What `by_scheme` names for `url`'s scheme, its module imported now; None for a scheme
    it does not name."""
    target = by_scheme.get(url_scheme(url))
    if target is None:
        return None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
