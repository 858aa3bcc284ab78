"""Responses API chains: a request that names a stored response (`previous_response_id`) or a
stored conversation (`conversation`) continues state that lives on one backend only.

Its conversation and turn come from the response-id map (kvmigrate.continuity.chains), not from
its body, and its backend is the one holding that state, whatever the split or a pin says:
the other backend has never seen the id and would answer 404, or worse, a fresh answer
without the history. Pure functions over plain data, like the rest of `policies`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kvmigrate.policies.route import Route

RESPONSE_PREFIX = "r:"  # a response id's entry in the store's link map
CONVERSATION_PREFIX = "v:"  # a Conversations API id's entry: its latest turn


@dataclass(frozen=True, slots=True)
class ChainRef:
    """What a Responses request continues: a stored response, a stored conversation, or both
    (the API refuses both together, but that is the backend's answer to give)."""

    previous: str | None
    conversation: str | None

    @property
    def key(self) -> str:
        """The map entry that names the backend and the turn this request continues."""
        if self.previous is not None:
            return RESPONSE_PREFIX + self.previous
        return CONVERSATION_PREFIX + (self.conversation or "")

    @property
    def conversation_key(self) -> str | None:
        """A Conversations API id is a conversation key of its own."""
        return None if self.conversation is None else id_key("conv:", self.conversation)

    @property
    def guessed_conversation(self) -> str:
        """The conversation of a request that continues a response no proxy remembers: its
        Conversations API id's, else one named for the response it continues."""
        return self.conversation_key or id_key("resp:", self.previous or "")


# An id as the APIs mint them (`resp_...`, `conv_...`); anything else a client sent in its
# place (a megabyte, an email address) names its conversation by a digest, not verbatim:
# the key is stored with every record of the conversation, whatever `record.content` says.
_API_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")


def id_key(prefix: str, value: str) -> str:
    if _API_ID.fullmatch(value):
        return prefix + value
    digest = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=12)
    return prefix + "h" + digest.hexdigest()


def chain_ref(body: Mapping[str, Any]) -> ChainRef | None:
    """The stored state a Responses request names, or None for a stateless request."""
    previous = body.get("previous_response_id")
    conversation = body.get("conversation")
    if isinstance(conversation, Mapping):  # `{"id": "conv_..."}` is the object form
        conversation = conversation.get("id")
    previous = previous if isinstance(previous, str) and previous else None
    conversation = conversation if isinstance(conversation, str) and conversation else None
    if previous is None and conversation is None:
        return None
    return ChainRef(previous, conversation)


@dataclass(frozen=True, slots=True)
class ChainEntry:
    """One stored response (or a Conversations API id's latest turn) as the map keeps it."""

    conversation: str
    turn: int
    backend: str  # where the response is stored: the only backend that can continue it
    # The candidate's own id for the shadow copy of this turn, when the model has one
    # candidate (or the entry predates several); with several, each one's own id in
    # `shadow_ids` as (candidate, id), so each copy continues its own chain.
    shadow_id: str = ""
    shadow_ids: tuple[tuple[str, str], ...] = ()

    def shadow_id_for(self, owner: str) -> str:
        """The id the shadow copy to `owner` (""): the only candidate) continues."""
        return dict(self.shadow_ids).get(owner, "") if owner else self.shadow_id

    def with_shadow_id(self, owner: str, candidate_id: str) -> ChainEntry:
        if not owner:
            return replace(self, shadow_id=candidate_id)
        others = tuple(m for m in self.shadow_ids if m[0] != owner)
        return replace(self, shadow_ids=(*others, (owner, candidate_id)))


def stick(routed: Route, backend: str) -> Route:
    """`routed` with the chain's backend serving and no fallback (no other backend holds the
    chain). A chain on the primary keeps the route's shadow copy, which continues the
    candidate's own shadowed chain; a chain moved off the split's choice has none."""
    if routed.serve == backend:
        return replace(routed, fallback=None, pin=False)
    return Route(routed.snapshot, serve=backend)


def unknown_chain(routed: Route, served: Collection[str]) -> Route:
    """A chain whose id no proxy remembers (expired, or written by a proxy without shared
    state): the primary is where hosted-API agents started, and the best guess."""
    if routed.snapshot.primary not in served:
        return stick(routed, routed.serve)  # only the candidate serves this model
    return stick(routed, routed.snapshot.primary)
