"""The rollout's modes: who answers, and who gets a copy."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """A StrEnum: a member equals its string, so stored state and JSON read the same."""

    SHADOW = "shadow"  # the primary answers and the candidate gets a copy
    SPLIT = "split"  # the candidate answers `percent`% of conversations
