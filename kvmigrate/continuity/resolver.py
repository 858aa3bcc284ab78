"""Conversation identity as a running proxy resolves it: declared (session header, `user`),
else by continuity with an answer this proxy fleet gave, else by the masked opening.

The links (history digest -> conversation, turn) live in an in-process LRU in front of the
rollout store, so every proxy sharing the store (Redis) continues a conversation another
one started. A request reads the LRU and, on a miss after turn 1, the store with a short
timeout. The workers of `--workers N` also share a table in memory
(kvmigrate.continuity.link_table), read before the store and written as a link is made: for
them the store keeps links for the next start, and nothing waits for it (a response id
still goes at once: `save`). Where another process must read the store (Redis, a pool
without its table), a request's own link is written as it arrives, while the upstream
answers, and the relay holds the answer's last byte (`settle`) until the next turn can find
the conversation in the store: usually that link is there already, and the answer waits for
nothing; otherwise it waits for the background task that writes whatever has queued in one
batch, however busy the machine. (Saved after the last byte, the link lost the race to a
client that sent its next turn at once.)

Proxy addon: `exchange_done` remembers served answers; `running`/`done` run the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from kvmigrate.continuity.link_table import LinkTable, fits
from kvmigrate.continuity.long_answers import LongAnswers
from kvmigrate.policies.continuity import History, answer_digest, iter_answer, request_history
from kvmigrate.policies.conversation import declared_key, derived_key, turn_index
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.state import Link
from kvmigrate.rollout.store import RolloutStore, StoreError
from kvmigrate.supervisor import Supervisor

log = logging.getLogger("kvmigrate.identity")

MAX_LOCAL_LINKS = 200_000
MAX_UNSAVED = 10_000
# A link read that does not answer in time reads as a miss, and the conversation starts
# again (maybe on the other backend): beside a CPU hog a Redis read can be slow, so the
# bound is generous. A hung
# store delays a later turn this long, once (a store that refuses fails at once).
REMOTE_LINK_TIMEOUT = 0.5
# Under load the links go to the store in one transaction per LINK_BATCH_S: one per answer
# (a thread hop, a transaction and the WAL's sync) cost about as much CPU as the proxy's
# own work on the answer (benchmarks/link_flush_cost.py). A link after a quiet spell still
# goes at once. Well under REMOTE_RETRY_DELAY: another proxy's second read must find a link
# this one just made.
LINK_BATCH_S = 0.005
# Where no other process reads the store (one proxy, not `--workers`), its links serve only
# the proxy's next start: a batch every quarter second, not every 5 ms. Each batch is a
# thread hop and a transaction whose thread contends for the loop's core and GIL, and at
# thousands of answers a second batches every LINK_BATCH_S cost a visible share of the
# default deployment's throughput (benchmarks/proxy_overhead.py). A SIGKILL loses at most
# this much of the links (soft state: a lost link costs a conversation its continuity
# across the restart, never a decision).
LOCAL_LINK_BATCH_S = 0.25
# A batch this large goes at once, whatever the window: it bounds what one write holds.
LINK_BATCH_MAX = 2_000
# Another proxy writes its link as soon as its answer is whole, but its client can be quicker
# still: a miss on a shared store is read once more after this long before it counts.
REMOTE_RETRY_DELAY = 0.01
# The longest an answer's last byte waits for its link's batch to reach the store: a store
# that hangs delays answers this much, then the link is saved later (a failing one: not at
# all, from its first failed batch until one is written again). Quiet, the wait is one
# batch write (benchmarks/link_flush_cost.py measures one on SQLite).
LINK_SAVE_WAIT = 1.0

# How a request's conversation was known. `guess`: a later turn (it resends answers) that
# matched no remembered answer, keyed by its masked opening; `body`: no messages at all.
# `chain`: a Responses API request continuing a stored response (kvmigrate.continuity.chains).
SOURCES = ("header", "user", "continuity", "opening", "guess", "body", "chain")


@dataclass(frozen=True, slots=True)
class Pending:
    """What to remember once this request's answer is whole."""

    route: str
    history: History
    conversation: str
    turn: int
    request_link_seq: int = 0  # the writer's number for the request's own link (0: none)


@dataclass(frozen=True, slots=True)
class Identity:
    conversation: str
    turn: int
    source: str
    pending: Pending | None = None


class ContinuityResolver:
    def __init__(
        self,
        store: RolloutStore | None = None,
        ttl_seconds: float = 3600.0,
        max_local: int = MAX_LOCAL_LINKS,
        remote_timeout: float = REMOTE_LINK_TIMEOUT,
        supervisor: Supervisor | None = None,
        batch_s: float | None = None,
        table: LinkTable | None = None,
    ) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self.max_local = max_local
        self.remote_timeout = remote_timeout
        self.supervisor = supervisor or Supervisor()
        self._local: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._unsaved: list[Link] = []
        self._wake: asyncio.Event | None = None
        # Links are numbered as they queue: every link up to `_stored` is in the store.
        self._queued = 0
        self._stored = 0
        self._next: _Batch | None = None  # the next batch, once it must go without delay
        self._writing: tuple[int, _Batch] | None = None  # the batch in flight, to its number
        self._gathering: asyncio.Future[None] | None = None  # the writer's batch window
        self._task: asyncio.Task[None] | None = None
        # The batch a cancelled writer was writing, and its write, which outlives it.
        self._in_flight: tuple[asyncio.Future[None], list[Link]] | None = None
        # The counter's child per source (`register_metrics`), and what `fold_counts` has
        # added to it: requests are counted in `counts`, a dict, and folded into Prometheus
        # before a scrape, as ProxyMetrics folds its tally (with `--workers` a counter
        # increment is a write to a memory-mapped file under a lock).
        self._counted: dict[str, Any] = {}
        self._folded: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.shared = store is not None and store.url.startswith(("redis://", "rediss://"))
        # Does another process read this store's links, so that an answer must wait until
        # its link is written (`settle`)? A Redis store is shared by design; the workers of
        # `proxy --workers N` share one SQLite file (prometheus-client's multiprocess
        # directory is set for them only). A single proxy knows its links in process, and
        # the wait (a thread hop and a transaction, on every answer at concurrency 1:
        # benchmarks/link_flush_cost.py) would be pure cost.
        self.others_read = self.shared or bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        # The workers of one pool share their links in memory (kvmigrate.continuity.link_table):
        # a link there needs no early write, and an answer waits for none. A Redis store is
        # read by other machines too, which only the store reaches in time.
        self.table = None if self.shared else table
        # How long the writer gathers links into one batch (LINK_BATCH_S, LOCAL_LINK_BATCH_S).
        # Links a table shares go to the store for the next start only, as a single proxy's.
        waits = self.others_read and self.table is None
        self.batch_s = batch_s or (LINK_BATCH_S if waits else LOCAL_LINK_BATCH_S)
        self._last_flush = -self.batch_s
        self.counts: dict[str, int] = dict.fromkeys(SOURCES, 0)
        self.store_errors = 0
        self._failing = False  # the last batch failed: answers do not wait for the store
        self._keys: StoreKeys | None = None
        self.long_answers = LongAnswers(self.remember)

    # -- resolving ----------------------------------------------------------------------------

    async def identify(
        self, headers: Mapping[str, str], body: Mapping[str, Any], model: str, route: str
    ) -> Identity:
        declared = declared_key(headers, body, route)
        if declared is not None:
            return self.count(Identity(declared.value, turn_index(body), declared.source))
        history = request_history(route, body)
        if history is None:
            whole = derived_key(body, model)
            source = "opening" if whole.source == "prefix" else "body"
            return self.count(Identity(whole.value, turn_index(body), source))
        found = self._local_link(history) if history.lookup is not None else None
        if found is None and history.lookup is not None and self.table is not None:
            found = self._table_link(history)
        if found is None and history.lookup is not None and self.store is not None:
            found = await self._remote(history)
        if found is not None:
            identity = Identity(found[0], found[1] + 1, "continuity")
        else:
            opening = derived_key(body, model).value
            source = "opening" if history.turn == 1 else "guess"
            identity = Identity(opening, history.turn, source)
        shared = self._link(history.request_link, identity.conversation, identity.turn)
        if self.others_read and self._wake is not None and not shared:
            # Written while the upstream answers: its next turn can find the conversation
            # by this link alone, and the answer need not wait for another write (`settle`).
            self._write_soon()
        pending = Pending(route, history, identity.conversation, identity.turn, self._queued)
        return self.count(Identity(identity.conversation, identity.turn, identity.source, pending))

    def in_store(self, conversation: str) -> str:
        """The conversation as the store keeps it (a declared key's keyed hash), or "" where
        that is the key itself (a derived key, a hash already, no store). A turn that does
        not declare its conversation again, after a restart or on another proxy, is known
        by that hash alone (ChainMap.identify)."""
        if self._keys is None:  # no store, or its keys not read yet (`_read_keys`)
            return ""
        stored = self._keys.conversation(conversation)
        return "" if stored == conversation else stored

    async def _read_keys(self) -> None:
        """The store's keys, read off the loop: a Redis store reads its secret at first use,
        and may be down."""
        store = self.store
        if store is None or self._keys is not None:
            return
        with contextlib.suppress(StoreError):
            self._keys = await asyncio.to_thread(lambda: store.keys)

    def _local_link(self, history: History) -> tuple[str, int] | None:
        """The answer link, else the request link (an answer not linked: it failed, or the
        client edited it before resending)."""
        for link in (history.lookup, history.asked):
            if link is not None and (found := self._local.get(link)) is not None:
                self._local.move_to_end(link)
                return found
        return None

    def _table_link(self, history: History) -> tuple[str, int] | None:
        """As `_local_link`, in the table another worker may have written."""
        assert self.table is not None
        for link in (history.lookup, history.asked):
            if link is not None and (found := self.table.get(link)) is not None:
                self._put(link, found)
                return found
        return None

    def count(self, identity: Identity) -> Identity:
        """Count a request under its identity's source (kvmigrate_conversation_identity)."""
        self.counts[identity.source] += 1
        return identity

    def fold_counts(self) -> None:
        """Add the requests counted since the last fold to the Prometheus counter."""
        for source, child in self._counted.items():
            count = self.counts[source]
            if count != self._folded[source]:
                child.inc(count - self._folded[source])
                self._folded[source] = count

    async def _remote(self, history: History) -> tuple[str, int] | None:
        keys = [k for k in (history.lookup, history.asked) if k is not None]
        links = await self._load(keys)
        if links == [] and self.shared:  # answered, without it: the writer may be a hair late
            await asyncio.sleep(REMOTE_RETRY_DELAY)
            links = await self._load(keys)
        if not links:
            return None
        best = min(links, key=lambda link: keys.index(link.key))  # the answer link first
        found = (best.conversation, best.turn)
        self._put(best.key, found)
        return found

    async def load(self, keys: list[str]) -> list[Link]:
        """The store's links of `keys`, or none when it does not answer in time."""
        return await self._load(keys) or []

    async def _load(self, keys: list[str]) -> list[Link] | None:
        """The store's links of `keys`; None when it failed or did not answer in time."""
        if self.store is None:
            return []
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(_load_links, self.store, keys), self.remote_timeout
            )
        except (TimeoutError, StoreError):
            return None

    # -- remembering --------------------------------------------------------------------------

    def remember(self, pending: Pending, response: Mapping[str, Any]) -> str | None:
        """Link the request's history plus its answer to the conversation; returns the link."""
        answer = list(iter_answer(pending.route, response))
        if not answer:
            return None
        link = answer_digest(pending.history.hasher, answer)
        self._link(link, pending.conversation, pending.turn)
        return link

    def _link(self, link: str, conversation: str, turn: int) -> bool:
        """Known here at once, to the pool's other workers too where they share a table
        (returns whether they do); in the store as soon as the writer's next batch lands."""
        self._put(link, (conversation, turn))
        expires_at = time.time() + self.ttl_seconds
        shared = self.table is not None and self.table.put(link, conversation, turn, expires_at)
        if self.store is not None:
            self.save(Link(link, conversation, turn, expires_at))
        return shared

    def save(self, link: Link, soon: bool = False) -> None:
        """Queue a link for the writer's next batch (response ids use it too).
        `soon`: another process may ask for it at once (a response id, which the client
        may send back to another worker as soon as it has the answer), so where one reads
        the store the batch goes without gathering."""
        if soon and self.others_read and self._wake is not None:
            self._write_soon()
        if self.store is not None:
            self._queued += 1
            unsaved = self._unsaved
            unsaved.append(link)
            if len(unsaved) > MAX_UNSAVED:
                del unsaved[:-MAX_UNSAVED]
            if self._wake is not None:
                self._wake.set()
                if len(unsaved) >= LINK_BATCH_MAX and self._gathering is not None:
                    _release(self._gathering)

    async def settle(self, exchange: Any) -> None:
        """Before the client's last byte: remember a served answer and wait (at most
        LINK_SAVE_WAIT) until the next turn can find its conversation in the store, since
        the client may send it, to any proxy, as soon as it has that byte. The request's
        own link, written while the upstream answered, is enough when the next turn will
        look it up (`History.continued_by_request`): then the answer is remembered after
        the relay and its link goes with a later batch, and the answer waits for nothing, or
        for the write already under way.
        Where no other process reads the store, nothing is done here: `exchange_done` after
        the relay keeps the answer's assembly and digest off the response path, and this
        process knows its links. Where the pool's workers share a table, a link is there as
        soon as it is made: the answer's is made here when the next turn will need it."""
        if self._wake is None or not self.others_read:
            return
        pending = exchange.continuity
        if not isinstance(pending, Pending):
            return  # declared by the client, or no history: no link of ours finds its next turn
        if self.table is not None and fits(pending.conversation):
            if not pending.history.continued_by_request:
                await self._remember_now(exchange)
            return
        if pending.history.continued_by_request:
            # The answer is remembered after the relay, as a single proxy does it.
            needed = pending.request_link_seq
        else:
            await self._remember_now(exchange)
            needed = self._queued  # every link queued so far, the answer's among them
        if self._stored >= needed or self._failing:
            return
        writing = self._writing  # the batch under way, if it holds what is needed
        batch = writing[1] if writing and writing[0] >= needed else self._write_soon()
        await asyncio.shield(batch.wait())

    def _write_soon(self) -> _Batch:
        """The next batch, which the writer now writes without gathering more."""
        batch = self._next
        if batch is None:
            batch = self._next = _Batch(asyncio.get_running_loop())
        if self._gathering is not None:
            _release(self._gathering)
        return batch

    def exchange_done(self, exchange: Any) -> None:
        """A served answer, whole: runs after the client's last byte, in the handler's task,
        so this proxy knows the link before the client can send its next turn. Every
        exchange (a copy, a failure too) learns its conversation as the store keys it, by
        which the recorder, an addon after this one, groups its turns. A copy has its
        answer's already, or none if its answer had none: it must not differ from it. A
        long answer is remembered by a task of its own (`LongAnswers`)."""
        pending = self._answered(exchange)
        if pending is None:
            return
        if exchange.long_answer:
            self.long_answers.start(pending, exchange)
            return
        response = exchange.answer()
        if response is not None:
            self.remember(pending, response)

    def _answered(self, exchange: Any) -> Pending | None:
        """What to remember of a whole answer, once the exchange knows its stored key."""
        if exchange.conversation and not exchange.conversation_in_store and not exchange.pair_id:
            exchange.conversation_in_store = self.in_store(exchange.conversation)
        pending = exchange.continuity
        if not isinstance(pending, Pending) or exchange.status != 200 or not exchange.ok:
            return None
        # An answer whose middle was not kept reassembles to no answer the client has.
        return None if exchange.answer_cut else pending

    async def _remember_now(self, exchange: Any) -> None:
        """`exchange_done` before the answer's last byte: a long one is reassembled here, a
        slice at a time, and the last byte waits for it (the loop does not)."""
        pending = self._answered(exchange)
        exchange.continuity = None  # remembered: `exchange_done` after the relay skips it
        if pending is None:
            return
        if exchange.long_answer:
            await self.long_answers.remember(pending, exchange)
        elif (response := exchange.answer()) is not None:
            self.remember(pending, response)

    def _put(self, link: str, value: tuple[str, int]) -> None:
        self._local[link] = value
        self._local.move_to_end(link)
        if len(self._local) > self.max_local:
            self._local.popitem(last=False)

    # -- addon hooks --------------------------------------------------------------------------

    def register_metrics(self, registry: CollectorRegistry) -> None:
        counter = Counter(
            "kvmigrate_conversation_identity",
            "Requests by how their conversation was identified: header, user, continuity "
            "(an earlier answer resent), opening (a first turn), guess (a later turn keyed by "
            "its masked opening only), body (no messages), chain (a Responses request "
            "continuing a stored response).",
            ["source"],
            registry=registry,
        )
        self._counted = {source: counter.labels(source) for source in SOURCES}

    async def running(self) -> None:
        if self.store is not None:
            self._wake = asyncio.Event()
            self._task = self.supervisor.start("conversation-links", self._writer)

    async def done(self) -> None:
        await self.long_answers.close()
        await self.supervisor.stop(self._task)
        with contextlib.suppress(StoreError):
            await self._finish_in_flight()
            await self._flush()

    async def _finish_in_flight(self) -> None:
        """Wait for the batch the stopped writer left in its thread, which goes on writing
        whatever happens to the task: the store is closed after `done`, and a batch that
        then fails is written again with the rest."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        write, batch = in_flight
        try:
            await write
        except StoreError:
            self._unsaved = batch[-MAX_UNSAVED:] + self._unsaved

    async def _writer(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        await self._read_keys()
        while True:
            await self._wake.wait()
            await self._read_keys()  # when the store was down at start
            delay = self._window(loop.time())
            if self._next is None and delay > 0 and len(self._unsaved) < LINK_BATCH_MAX:
                # Nothing in it must go at once yet: let it gather, until the window ends,
                # something must (`_write_soon`) or it holds LINK_BATCH_MAX links (`save`).
                self._gathering = loop.create_future()
                handle = loop.call_later(delay, _release, self._gathering)
                await self._gathering
                handle.cancel()
            # What queues while this batch is being written goes in the next one (group
            # commit): a busy proxy still writes many links per transaction, and an answer
            # never waits for a timer.
            self._wake.clear()
            self._last_flush = loop.time()
            try:
                await self._flush()
            except StoreError as exc:
                self.store_errors += 1
                if self.store_errors == 1 or self.store_errors % 1000 == 0:
                    log.error("cannot save conversation links, retrying: %s", exc)
                await asyncio.sleep(1.0)
                self._wake.set()

    def _window(self, now: float) -> float:
        """How long the next batch gathers. A single proxy's window runs from its last
        write, so a link after a quiet spell goes at once. Where another process reads the
        store, what must go at once says so (`_write_soon`: a request's own link, a response
        id, an answer that waits), and the rest (answers' links) joins it or waits the whole
        window, never a write of its own beside the next request."""
        return self.batch_s if self.others_read else self._last_flush + self.batch_s - now

    async def _flush(self) -> None:
        if not self._unsaved or self.store is None:
            return
        batch, self._unsaved = self._unsaved, []
        waiting = self._next or _Batch(asyncio.get_running_loop())
        self._next = None
        # Every link up to `last` is in this batch, in an earlier one, or was dropped
        # (MAX_UNSAVED): once this one is written, all of them are done with.
        last = self._queued
        self._writing = (last, waiting)
        # Shielded: a thread's write cannot be cancelled, so a writer stopped mid-batch
        # (`done`) leaves it to `_finish_in_flight` rather than to nobody.
        write = asyncio.ensure_future(asyncio.to_thread(_save_links, self.store, batch))
        try:
            await asyncio.shield(write)
            self._stored, self._failing = last, False
        except asyncio.CancelledError:
            self._in_flight = (write, batch)
            raise
        except StoreError:
            self._unsaved = batch[-MAX_UNSAVED:] + self._unsaved
            self._failing = True
            raise
        finally:
            # Failed too: an answer does not wait on a broken store (the batch is retried).
            self._writing = None
            waiting.end()


def _release(waiting: asyncio.Future[None]) -> None:
    if not waiting.done():
        waiting.set_result(None)


class _Batch:
    """The answers waiting for one batch of links: released when it is written, when it
    fails, or after LINK_SAVE_WAIT, by one timer for the batch, not one per answer."""

    __slots__ = ("_deadline", "written")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.written: asyncio.Future[None] = loop.create_future()
        self._deadline: asyncio.TimerHandle | None = None

    def wait(self) -> asyncio.Future[None]:
        if self._deadline is None:
            self._deadline = self.written.get_loop().call_later(
                LINK_SAVE_WAIT, _release, self.written
            )
        return self.written

    def end(self) -> None:
        _release(self.written)
        if self._deadline is not None:
            self._deadline.cancel()


# The store keeps a link's key, and a conversation a client declared, as the store's keyed
# hash (kvmigrate.rollout.keys); this process knows them in the clear. Run in a thread:
# a Redis store reads its secret at first use.
def _save_links(store: RolloutStore, links: list[Link]) -> None:
    keys = store.keys
    latest = {link.key: link for link in links}  # a key saved twice in a batch: its last
    store.save_links(
        [
            Link(keys.key(k.key), keys.conversation(k.conversation), k.turn, k.expires_at, k.detail)
            for k in latest.values()
        ]
    )


def _load_links(store: RolloutStore, clear: list[str]) -> list[Link]:
    """The links of `clear` keys, under those keys (their conversations as stored)."""
    hashed = {store.keys.key(k): k for k in clear}
    return [replace(k, key=hashed[k.key]) for k in store.load_links(list(hashed))]
