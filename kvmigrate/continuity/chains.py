"""The response-id map: which conversation, turn and backend each Responses API answer
belongs to, so a request naming it (`previous_response_id`) continues that conversation, on
the backend that stored it, one turn later.

An answer's id is read when its exchange ends (a stream's from its `response.created`
event), kept in an in-process LRU at once, before the client can name it, and queued for the
rollout store through the conversation links' writer (`r:<id>` links, same TTL as pins), so
every proxy sharing the store (Redis) continues a chain another one started.

Shadowed chains: the shadow copy of turn N must name the candidate's own id of turn N-1.
While that copy runs, a future stands for its id in this process; once it is known it goes
into the map as the primary entry's `shadow`. The workers of one pool also write each
copy's end into the table they share (kvmigrate.continuity.shadow_id_table), where another
worker's copy of the next turn waits for it; proxies sharing a Redis store wait for the
store. A model with several candidates shadows each on its own chain: their ids are kept
by candidate (the "owner" below; "" where the model has only one, which keeps such entries
in the layout earlier releases wrote and read).

Proxy addon: `exchange_done` reads ids, `register_metrics` adds the miss counter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from kvmigrate.continuity.resolver import ContinuityResolver, Identity
from kvmigrate.continuity.shadow_id_table import ENDED, IN_STORE, ShadowIdTable
from kvmigrate.exchange import Role
from kvmigrate.logtext import printable
from kvmigrate.policies.chain import CONVERSATION_PREFIX, RESPONSE_PREFIX, ChainEntry, ChainRef
from kvmigrate.rollout.keys import is_hashed
from kvmigrate.rollout.state import Link
from kvmigrate.wire.response_id import response_id

log = logging.getLogger("kvmigrate.identity")

MAX_LOCAL_ENTRIES = 200_000
# A next turn sent to another proxy can overtake the first proxy's write: read twice more.
REMOTE_RETRY_DELAYS = (0.01, 0.05)
# A shadow copy of a turn whose previous turn another proxy (or another worker of the pool)
# served waits this long, at most, for that one's copy to bring the candidate's id (it runs
# in the background).
SHADOW_ID_WAIT = 2.0
SHADOW_ID_POLL = 0.05


@dataclass(slots=True)
class ChainTurn:
    """A Responses request's place in its chain, carried by its exchange; the answer's id is
    filled in once seen."""

    conversation: str
    turn: int
    stores: bool  # `store` was not false: the answer can be continued
    conversation_id: str | None = None  # a Conversations API id the request named
    copy_of: str | None = None  # a shadow copy: the primary's response id it copies
    copy_owner: str = ""  # ... for this candidate ("": the model's only one)
    response_id: str | None = None


class ChainMap:
    def __init__(
        self,
        links: ContinuityResolver,
        max_local: int = MAX_LOCAL_ENTRIES,
        key_of: Callable[[str], str] | None = None,
    ) -> None:
        # The conversation links' store, TTL and writer: one batch for both kinds of link.
        self.links = links
        self.max_local = max_local
        # A served answer's id as the map keys it. A gateway that rewrites ids on their way
        # to the client (LiteLLM) keys by the id every form of one response shares, and
        # names the requests' ids by the same function; a proxy relays them as they are.
        self.key_of = key_of
        self._local: OrderedDict[str, ChainEntry] = OrderedDict()
        self._shadows: dict[tuple[str, str], asyncio.Future[str | None]] = {}
        self._misses: Counter | None = None
        self.misses = 0

    # -- resolving ----------------------------------------------------------------------------

    async def identify(
        self, ref: ChainRef, declared: str | None = None
    ) -> tuple[Identity, str | None]:
        """The request's conversation and turn, and the backend that holds its chain (None:
        an id nobody remembers, counted and logged once). `declared`: the conversation key
        the request states, which recovers a conversation the store keeps hashed."""
        entry = await self.find(ref.key)
        if entry is not None:
            conversation = entry.conversation
            if is_hashed(conversation) and self.links.store is not None:
                candidates = (declared, ref.conversation_key)
                conversation = self.links.store.keys.recover(conversation, candidates)
            return self.links.count(Identity(conversation, entry.turn + 1, "chain")), entry.backend
        if ref.previous is None:
            # A Conversations API id seen for the first time: its first turn. Conversations
            # are created through the primary (a pass-through route), so they live there.
            key = ref.conversation_key or ""
            return self.links.count(Identity(key, 1, "chain")), None
        self.misses += 1
        if self._misses is not None:
            self._misses.inc()
        if self.misses == 1:
            log.warning(
                "a Responses request continues response %s, which no proxy remembers (expired, "
                "or stored by a proxy without shared state): sent to the primary; "
                "kvmigrate_chain_misses_total counts these",
                printable(ref.previous, 64),  # the client's: no forged lines, no megabytes
            )
        return self.links.count(Identity(ref.guessed_conversation, 2, "guess")), None

    async def find(self, key: str) -> ChainEntry | None:
        """The entry of `key`: this process's first, else the store's (then kept here)."""
        entry = self._local.get(key)
        if entry is not None:
            self._local.move_to_end(key)
            return entry
        if self.links.store is None:
            return None
        links = await self.links.load([key])
        # Only a response id is worth waiting for: an unknown Conversations API id is new.
        retry = self.links.others_read and key.startswith(RESPONSE_PREFIX)
        for delay in REMOTE_RETRY_DELAYS if retry else ():
            if links:
                break
            await asyncio.sleep(delay)
            links = await self.links.load([key])
        if not links:
            return None
        entry = _entry(links[0])
        self._put(key, entry)
        return entry

    # -- remembering --------------------------------------------------------------------------

    def exchange_done(self, exchange: Any) -> None:
        """An answer, whole: its id goes into the map before the client can send it back."""
        turn = exchange.chain
        if not isinstance(turn, ChainTurn):
            return
        if exchange.status == 200 and exchange.ok:
            found = response_id(exchange.chunks)
            # A copy's id stays as the candidate's gateway gave it: the next copy sends it
            # back through the same gateway.
            if found is not None and self.key_of is not None and exchange.role != Role.SHADOW:
                found = self.key_of(found)
            turn.response_id = found
        if exchange.role == Role.SHADOW:
            if turn.copy_of is not None:
                self.record_shadow_id(turn.copy_of, turn.response_id, turn.copy_owner)
            return
        if exchange.role != Role.SERVE or turn.response_id is None or not turn.stores:
            return
        entry = ChainEntry(turn.conversation, turn.turn, exchange.backend)
        self.keep(RESPONSE_PREFIX + turn.response_id, entry)
        if turn.conversation_id is not None:
            self.keep(CONVERSATION_PREFIX + turn.conversation_id, entry)

    def keep(self, key: str, entry: ChainEntry) -> None:
        self._put(key, entry)
        # [backend, shadow id] as before several candidates; a third item only when there are.
        kept: list[object] = [entry.backend, entry.shadow_id]
        if entry.shadow_ids:
            kept.append(dict(entry.shadow_ids))
        detail = orjson.dumps(kept).decode()
        expires = time.time() + self.links.ttl_seconds
        self.links.save(Link(key, entry.conversation, entry.turn, expires, detail), soon=True)

    def _put(self, key: str, entry: ChainEntry) -> None:
        self._local[key] = entry
        self._local.move_to_end(key)
        if len(self._local) > self.max_local:
            self._local.popitem(last=False)

    # -- shadowed chains ----------------------------------------------------------------------

    def expect_shadow_id(self, primary_id: str, owner: str = "") -> None:
        """A shadow copy (to `owner`) of the turn that answered `primary_id` is on its way."""
        self._shadows[primary_id, owner] = asyncio.get_running_loop().create_future()
        if (shadows := self._shared_shadow_ids()) is not None:
            shadows.running(primary_id, owner, time.time() + self.links.ttl_seconds)

    def record_shadow_id(self, primary_id: str, candidate_id: str | None, owner: str = "") -> None:
        """The copy of `primary_id`'s turn to `owner` ended: with the candidate's own id, or
        without one (it failed, or was never sent). Safe to call more than once."""
        future = self._shadows.pop((primary_id, owner), None)
        if future is not None and not future.done():
            future.set_result(candidate_id)
            # Its end, once: a later call (the copy settling) knows no more than the first.
            if (shadows := self._shared_shadow_ids()) is not None:
                expires = time.time() + self.links.ttl_seconds
                shadows.ended(primary_id, owner, candidate_id, expires)
        entry = self._local.get(RESPONSE_PREFIX + primary_id)
        if candidate_id is not None and entry is not None:
            self.keep(RESPONSE_PREFIX + primary_id, entry.with_shadow_id(owner, candidate_id))

    async def shadow_id_of(self, primary_id: str, owner: str = "") -> str | None:
        """The candidate's (`owner`'s) own id for the turn that answered `primary_id`,
        waiting for its copy if it is still running; None when it has no such turn."""
        future = self._shadows.get((primary_id, owner))
        if future is not None:
            return await asyncio.shield(future)
        key = RESPONSE_PREFIX + primary_id
        entry = await self.find(key)
        if entry is None:
            return None
        if entry.shadow_id_for(owner):
            return entry.shadow_id_for(owner)
        if (shadows := self._shared_shadow_ids()) is not None:
            return await self._shadow_id_from_table(shadows, primary_id, owner)
        if self.links.shared:
            return await self._shadow_id_from_store(key, owner)
        return None

    def _shared_shadow_ids(self) -> ShadowIdTable | None:
        """The table where this pool's workers say how their copies run (none elsewhere)."""
        return self.links.table.shadow_ids if self.links.table is not None else None

    async def _shadow_id_from_table(
        self, shadows: ShadowIdTable, primary_id: str, owner: str
    ) -> str | None:
        """Another worker of this pool served the turn, and its copy may still be running:
        that worker says so in the table the workers share, and then how it ended. A copy
        said to run is waited for as a copy on this worker would be (the shadow copies'
        deadline ends the wait); one nobody spoke of (its worker is about to, or restarted)
        for SHADOW_ID_WAIT. An id the table did not keep (too long, evicted) is in the store."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHADOW_ID_WAIT
        key = RESPONSE_PREFIX + primary_id
        while True:
            said = shadows.read(primary_id, owner)
            if said is not None and said[0] == ENDED:
                return said[1] or None  # "": that copy ended without an id
            if said is not None and said[0] == IN_STORE:
                return await self._shadow_id_from_store(key, owner)
            if said is None and loop.time() >= deadline:
                return await self._shadow_id_from_store(key, owner, polls=1)
            await asyncio.sleep(SHADOW_ID_POLL)  # another process's write: nothing to await

    async def _shadow_id_from_store(self, key: str, owner: str, polls: int = 0) -> str | None:
        """Another proxy served the turn, and its copy may still be running: its id comes
        into the shared store when the copy ends. `polls`: read this many times at most
        (0: until SHADOW_ID_WAIT has passed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SHADOW_ID_WAIT
        while loop.time() < deadline:
            await asyncio.sleep(SHADOW_ID_POLL)
            links = await self.links.load([key])
            entry = _entry(links[0]) if links else None
            if entry is not None and entry.shadow_id_for(owner):
                self._put(key, entry)
                return entry.shadow_id_for(owner)
            polls -= 1
            if polls == 0:
                break
        return None

    # -- addon hooks --------------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        self._misses = Counter(
            "kvmigrate_chain_misses",
            "Responses API requests continuing a response id no proxy remembers (expired, or "
            "stored by a proxy without shared state); they go to the primary.",
            registry=registry,
        )


def _entry(link: Link) -> ChainEntry:
    """A stored link as an entry: `[backend, shadow id]`, as every release writes it, with
    `{candidate: id}` after them where a model has several candidates."""
    try:
        backend, shadow, *more = orjson.loads(link.detail)
        named = more[0] if more and isinstance(more[0], dict) else {}
    except (orjson.JSONDecodeError, ValueError, TypeError):
        backend, shadow, named = "", "", {}
    shadows = tuple((str(owner), str(own)) for owner, own in named.items())
    return ChainEntry(link.conversation, link.turn, str(backend), str(shadow or ""), shadows)
