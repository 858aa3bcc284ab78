"""Keep a path named by a manifest inside the folder it is relative to.

A manifest names each file by its path in the tree. One path like `../outside/x.sh`, or
one that passes through a folder since replaced by a symlink, would have a revert write
anywhere the user may write: each path is checked against its real location first.
"""

from __future__ import annotations

import os
from pathlib import Path


class OutsideTree(ValueError):
    """A path that would lead out of its folder."""


def inside(top: Path, rel: object) -> Path:
    """`top / rel`, refused unless it names something inside `top` once every symlink on
    the way (the last name's too) is resolved."""
    if not isinstance(rel, str) or not rel or "\0" in rel or os.path.isabs(rel):
        raise OutsideTree(f"{_shown(rel)} is not a path inside {top}")
    path = top / rel
    real_top = os.path.realpath(top)
    real = os.path.realpath(path)
    if real == real_top or os.path.commonpath([real_top, real]) != real_top:
        raise OutsideTree(f"{_shown(rel)} leads outside {top}")
    return path


def _shown(rel: object) -> str:
    text = repr(rel)
    return text if len(text) <= 200 else text[:200] + "..."
