"""The rollout's modes: who answers, and who gets a copy."""

from __future__ import annotations

from enum import StrEnum


class Mode(StrEnum):
    """A StrEnum: a member equals its string, so stored state and JSON read the same."""

    SHADOW = "shadow"  # the primary answers and the candidate gets a copy
    SPLIT = "split"  # the candidate answers `percent`% of conversations
    # The primary answers and nobody gets a copy: the hosted API measured alone, before
    # any candidate exists (the playbook's evaluate phase). Set in the config, not by
    # `kvmigrate rollout`.
    OBSERVE = "observe"


# The modes `kvmigrate rollout` and the admin API may switch between.
SWITCHABLE = (Mode.SHADOW, Mode.SPLIT)
