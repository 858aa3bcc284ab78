"""Routing and rollout policies: pure functions over plain data, no I/O."""

from kvmigrate.policies.conversation import ConversationKey, conversation_key, turn_index
from kvmigrate.policies.decision import Decision, RolloutSnapshot, decide
from kvmigrate.policies.modes import Mode
from kvmigrate.policies.route import Route, route, serve_without_conversation
from kvmigrate.policies.split import bucket, in_candidate_share, in_shadow_sample

__all__ = [
    "ConversationKey",
    "Decision",
    "Mode",
    "RolloutSnapshot",
    "Route",
    "bucket",
    "conversation_key",
    "decide",
    "in_candidate_share",
    "in_shadow_sample",
    "route",
    "serve_without_conversation",
    "turn_index",
]
