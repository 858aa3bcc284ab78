"""`continuity/resolver.py`'s links writer, row by row: when a batch of links goes to the
store, what it holds, and how long an answer waits for it (`settle`).

The store is a real SQLite store that notes each batch it wrote, and can hang or refuse a
write, as a slow disk, a full one or a dropped Redis would. A window the test never waits
out (60 s) tells a batch that went at once from one that gathered; a bound is asserted only
from below (a busy machine makes a wait longer, never shorter). The identity side is in
test_resolver_table.py, the proxies and pools end to end in test_lookup_paths.py."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kvmigrate.continuity import resolver as resolver_module
from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.continuity.resolver import (
    LINK_BATCH_MAX,
    LINK_SAVE_WAIT,
    MAX_UNSAVED,
    ContinuityResolver,
    Pending,
)
from kvmigrate.exchange import SERVE, Exchange
from kvmigrate.rollout.keys import StoreKeys
from kvmigrate.rollout.sqlite_store import SqliteRolloutStore
from kvmigrate.rollout.state import Link, RolloutState
from kvmigrate.rollout.store import StoreError
from kvmigrate.supervisor import Supervisor

MODEL = "gpt-4o-mini"
ROUTE = "chat/completions"
FIRST = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Find where the config is parsed."},
]
ANSWER = {"role": "assistant", "content": "In kvmigrate/config/load.py."}
LATER = [*FIRST, ANSWER, {"role": "user", "content": "And the defaults?"}]
# Longer than any row waits: a batch written before it ends did not wait for it.
LONG_WINDOW = 60.0
DEADLINE = 30.0


class RecordingStore(SqliteRolloutStore):
    """A real SQLite store that notes every batch of links it wrote; `gate` cleared makes a
    write hang until it is set, `refusing` makes one fail as a store does (StoreError),
    `broken` as a bug would (any other exception)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, RolloutState())
        self.batches: list[list[Link]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.refusing = False
        self.broken = False
        self.attempts = 0
        self.clear: dict[str, str] = {}
        self.load_gate = threading.Event()  # cleared: a read hangs until it is set
        self.load_gate.set()
        self.late: list[Link] = []  # written by "another proxy" just after the first read
        self.keys_down = False
        self.hang_after: int | None = None  # writes after this many hang on `later_gate`
        self.later_gate = threading.Event()

    @property
    def keys(self) -> StoreKeys:
        if self.keys_down:
            raise StoreError("rollout store: cannot read the keys")
        return self._keys_value

    @keys.setter
    def keys(self, value: StoreKeys) -> None:
        self._keys_value = value

    def load_links(self, keys: Sequence[str]) -> list[Link]:
        self.load_gate.wait(DEADLINE)
        found = super().load_links(keys)
        if self.late:
            late, self.late = self.late, []
            super().save_links(late)
        return found

    def save_links(self, links: Sequence[Link]) -> None:
        self.attempts += 1
        refusing = self.refusing  # as the write began: a hung write fails as it was set to
        self.gate.wait(DEADLINE)
        if self.hang_after is not None and self.attempts > self.hang_after:
            self.later_gate.wait(DEADLINE)
        if refusing:
            raise StoreError("rollout store: disk full")
        if self.broken:
            raise RuntimeError("a bug in the store")
        super().save_links(links)
        self.batches.append(list(links))

    def written(self) -> list[list[str]]:
        """Each batch's keys, in the clear (the store keeps their keyed hashes)."""
        return [[self.clear[link.key] for link in batch] for batch in self.batches]


@pytest.fixture
def store(sqlite_url: str) -> Iterator[RecordingStore]:
    recording = RecordingStore(sqlite_url)
    yield recording
    recording.gate.set()
    recording.load_gate.set()
    recording.later_gate.set()
    recording.close()


def link(store: RecordingStore, name: str, expires_at: float = 0.0) -> Link:
    """A link the store will show under `name` (`written`)."""
    store.clear[store.keys.key(name)] = name
    return Link(name, "conversation-" + name, 1, expires_at or time.time() + 600)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


async def stays(condition: Callable[[], bool], seconds: float = 0.3) -> bool:
    """Whether `condition` holds throughout a short wait."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not condition():
            return False
        await asyncio.sleep(0.01)
    return True


def run(step: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(step())


@pytest.fixture
def others_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """As a worker of `proxy --workers N` without the shared table: other processes read the
    store (prometheus-client's multiprocess folder is set for the pool's workers only)."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))


# -- who reads the store, and how long a batch gathers ----------------------------------------


@pytest.mark.parametrize(
    ("scheme", "pool", "with_table", "shared", "reads", "kept_table", "window"),
    [
        # a single proxy: its links serve its own next start, a batch every quarter second
        ("sqlite:///", False, False, False, False, False, 0.25),
        # a pool without its table: the other workers read the store, at once
        ("sqlite:///", True, False, False, True, False, 0.005),
        # a pool with its table: the workers read the table, the store is for the next start
        ("sqlite:///", True, True, False, True, True, 0.25),
        # Redis is shared by design, with or without TLS; other machines read only the store
        ("redis://", False, True, True, True, False, 0.005),
        ("rediss://", False, False, True, True, False, 0.005),
    ],
)
def test_who_reads_the_links_decides_the_batch_window(
    store: RecordingStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    scheme: str,
    pool: bool,
    with_table: bool,
    shared: bool,
    reads: bool,
    kept_table: bool,
    window: float,
) -> None:
    if pool:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    else:
        monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    # Only the URL's scheme is read for this; the links still go to SQLite.
    store.url = scheme + "links-host/0" if scheme.startswith("redis") else store.url
    table = LinkTable(create_table(str(tmp_path))) if with_table else None
    resolver = ContinuityResolver(store, table=table)
    assert (resolver.shared, resolver.others_read) == (shared, reads)
    assert (resolver.table is table and table is not None) == kept_table
    assert resolver.batch_s == window
    assert ContinuityResolver(store, table=table, batch_s=2.5).batch_s == 2.5


def test_a_link_expires_an_hour_after_it_is_made_by_default(store: RecordingStore) -> None:
    async def go() -> tuple[float, float]:
        resolver = ContinuityResolver(store)
        await resolver.running()
        before = time.time()
        opening = await resolver.identify({}, {"model": MODEL, "messages": FIRST}, MODEL, ROUTE)
        after = time.time()
        assert opening.pending is not None
        await resolver.done()
        return before, after

    before, after = run(go)
    [[request_link]] = store.batches
    assert before + 3600 <= request_link.expires_at <= after + 3600
    assert request_link.turn == 1


# -- when a batch goes -------------------------------------------------------------------------


def test_a_single_proxys_link_after_a_quiet_spell_goes_at_once_and_the_next_ones_gather(
    store: RecordingStore,
) -> None:
    supervisor = Supervisor(backoff_s=0.01)

    async def go() -> list[list[list[str]]]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW, supervisor=supervisor)
        await resolver.running()
        seen = []
        resolver.save(link(store, "a"))
        await until(lambda: len(store.batches) == 1, "the first link written")
        resolver.save(link(store, "b"))
        resolver.save(link(store, "c"))
        assert await stays(lambda: len(store.batches) == 1)  # gathering for the window
        seen.append(store.written())
        await resolver.done()  # what is left goes at the end
        seen.append(store.written())
        return seen

    assert run(go) == [[["a"]], [["a"], ["b", "c"]]]
    assert supervisor.restarts == {}  # the writer gathered; it did not fail and restart


def test_a_single_proxys_request_links_gather_like_any_other(store: RecordingStore) -> None:
    """No other process reads the store: a request's own link is not written early."""

    async def go() -> tuple[bool, int]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        await resolver.identify({}, {"model": MODEL, "messages": FIRST}, MODEL, ROUTE)
        await until(lambda: len(store.batches) == 1, "the link after a quiet spell")
        other = [FIRST[0], {"role": "user", "content": "Another task."}]
        await resolver.identify({}, {"model": MODEL, "messages": other}, MODEL, ROUTE)
        gathered = await stays(lambda: store.attempts == 1)
        await resolver.done()
        return gathered, len(store.batches)

    gathered, batches = run(go)
    assert gathered
    assert batches == 2


def test_where_others_read_the_store_a_link_that_must_go_takes_the_gathered_ones_along(
    store: RecordingStore, others_read: None
) -> None:
    async def go() -> list[list[list[str]]]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        seen = []
        resolver.save(link(store, "answer"))  # an answer's link: it waits the window
        assert await stays(lambda: store.batches == [])
        seen.append(store.written())
        resolver.save(link(store, "response-id"), soon=True)  # another worker may ask for it
        await until(lambda: len(store.batches) == 1, "the batch that had to go")
        seen.append(store.written())
        resolver.save(link(store, "later"), soon=False)
        assert await stays(lambda: len(store.batches) == 1)
        await resolver.done()
        seen.append(store.written())
        return seen

    assert run(go) == [[], [["answer", "response-id"]], [["answer", "response-id"], ["later"]]]


@pytest.mark.parametrize(
    "queued",
    [
        # queued at once, before the writer woke: it does not gather at all
        [LINK_BATCH_MAX],
        # one short of the bound, then one more while the writer gathers: it goes then
        [LINK_BATCH_MAX - 1, 1],
    ],
)
def test_a_batch_of_the_largest_size_goes_without_waiting_the_window(
    store: RecordingStore, queued: list[int]
) -> None:
    async def go() -> tuple[list[int], bool]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        resolver.save(link(store, "first"))
        await until(lambda: len(store.batches) == 1, "the first link written")
        names = iter(range(LINK_BATCH_MAX))
        for count in queued:
            for _ in range(count):
                resolver.save(link(store, f"l{next(names)}"))
            await asyncio.sleep(0.05)  # the writer wakes, and gathers what is short
        await until(lambda: len(store.batches) == 2, "the full batch written")
        one_short = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await one_short.running()
        one_short.save(link(store, "alone"))
        await until(lambda: len(store.batches) == 3, "a link after a quiet spell")
        for index in range(LINK_BATCH_MAX - 1):
            one_short.save(link(store, f"short{index}"))
        gathered = await stays(lambda: len(store.batches) == 3)
        await resolver.done()
        await one_short.done()
        return [len(batch) for batch in store.batches], gathered

    sizes, gathered = run(go)
    assert sizes == [1, LINK_BATCH_MAX, 1, LINK_BATCH_MAX - 1]
    assert gathered


def test_a_failing_store_keeps_the_newest_links_and_writes_them_once_it_recovers(
    store: RecordingStore,
) -> None:
    """The store refuses while links keep coming: the writer keeps the last MAX_UNSAVED of
    them, in order, plus those queued while its failed write was under way, and writes them
    when the store answers again."""

    async def go() -> tuple[list[str], list[str]]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        store.refusing = True
        store.gate.clear()  # the first write hangs, then fails
        await resolver.running()
        names = [f"l{index}" for index in range(MAX_UNSAVED + 5)]
        for name in names:
            resolver.save(link(store, name))
        await until(lambda: store.attempts == 1, "the first write under way")
        during = [f"during{index}" for index in range(3)]
        for name in during:
            resolver.save(link(store, name))
        store.gate.set()
        await until(lambda: resolver.store_errors == 1, "the failed write counted")
        store.refusing = False
        await until(lambda: len(store.batches) == 1, "the kept links written")
        await resolver.done()
        return names[5:] + during, [name for batch in store.written() for name in batch]

    expected, written = run(go)
    assert written == expected
    assert store.attempts == 2


def test_a_writer_that_fails_unexpectedly_is_restarted_under_its_name(
    store: RecordingStore,
) -> None:
    async def go() -> tuple[dict[str, int], list[list[str]]]:
        supervisor = Supervisor(backoff_s=0.01)
        registry = CollectorRegistry()
        supervisor.register_metrics(registry)
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW, supervisor=supervisor)
        store.broken = True
        await resolver.running()
        resolver.save(link(store, "lost"))
        await until(lambda: supervisor.restarts["conversation-links"] == 1, "a restart")
        store.broken = False
        resolver.save(link(store, "next"))  # gathers for the window; done() writes it
        await resolver.done()
        return dict(supervisor.restarts), store.written()

    restarts, written = run(go)
    assert restarts == {"conversation-links": 1}
    assert written == [["next"]]


@pytest.mark.parametrize(
    ("fails", "written"),
    [(False, [["in-flight"]]), (True, [["in-flight", "queued"]])],
)
def test_done_waits_for_the_batch_a_stopped_writer_left_in_flight(
    store: RecordingStore, fails: bool, written: list[list[str]]
) -> None:
    """A thread's write outlives the writer's task: the proxy closes the store after `done`,
    so `done` waits for it, and writes it again with the rest if it failed."""

    async def go() -> tuple[bool, list[list[str]]]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        store.gate.clear()
        store.refusing = fails
        resolver.save(link(store, "in-flight"))
        await until(lambda: store.attempts == 1, "the batch under way")
        if fails:
            resolver.save(link(store, "queued"))
        stopping = asyncio.ensure_future(resolver.done())
        waited = await stays(lambda: not stopping.done())
        store.refusing = False
        store.gate.set()
        await asyncio.wait_for(stopping, DEADLINE)
        return waited, store.written()

    waited, seen = run(go)
    assert waited
    assert seen == written


def test_without_a_store_nothing_is_queued_and_no_writer_runs() -> None:
    async def go() -> tuple[int, int]:
        resolver = ContinuityResolver()
        await resolver.running()
        resolver.save(Link("c:x", "conversation", 1, time.time() + 60), soon=True)
        tasks = len(asyncio.all_tasks())
        await resolver.done()
        return resolver._queued, tasks

    queued, tasks = run(go)
    assert (queued, tasks) == (0, 1)


# -- how long an answer waits: settle ---------------------------------------------------------


def exchange_for(pending: Pending) -> Exchange:
    answer = (
        b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":'
        b'[{"index":0,"message":{"role":"assistant","content":"In kvmigrate/config/load.py."},'
        b'"finish_reason":"stop"}]}'
    )
    exchange = Exchange(
        "req-1", ROUTE, "hosted", SERVE, MODEL, MODEL, pending.conversation, pending.turn,
        False, time.perf_counter(), status=200,
    )  # fmt: skip
    exchange.continuity = pending
    exchange.chunks.append(answer)
    return exchange


async def opening(resolver: ContinuityResolver, messages: list[dict[str, str]]) -> Exchange:
    identity = await resolver.identify({}, {"model": MODEL, "messages": messages}, MODEL, ROUTE)
    assert identity.pending is not None
    return exchange_for(identity.pending)


async def found_later(store: RecordingStore) -> str:
    """How a fresh proxy on this store knows the next turn."""
    reader = ContinuityResolver(store, 60.0)
    later = await reader.identify({}, {"model": MODEL, "messages": LATER}, MODEL, ROUTE)
    return later.source


@pytest.mark.parametrize(
    ("messages", "remembered_now"),
    [
        # the next turn finds the request's own link: the answer is remembered after the relay
        (FIRST, False),
        # an assistant prefill is continued by its answer: that answer's link must be written
        ([*FIRST, {"role": "assistant", "content": "In"}], True),
    ],
)
def test_where_others_read_the_store_the_answer_waits_until_its_next_turn_is_findable(
    store: RecordingStore, others_read: None, messages: list[dict[str, str]], remembered_now: bool
) -> None:
    async def go() -> tuple[str, bool]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        exchange = await opening(resolver, messages)
        await asyncio.wait_for(resolver.settle(exchange), DEADLINE)
        source = await found_later(store)
        await resolver.done()
        return source, exchange.continuity is None

    source, remembered = run(go)
    assert remembered == remembered_now
    # the request's own link, or the answer's, found by a proxy that never saw either
    assert source == ("guess" if remembered_now else "continuity")


def test_an_answer_waits_for_a_hung_store_no_longer_than_link_save_wait(
    store: RecordingStore, others_read: None
) -> None:
    async def go() -> tuple[float, bool, int]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        store.gate.clear()
        exchange = await opening(resolver, FIRST)
        await until(lambda: store.attempts == 1, "the request's link being written")
        started = time.monotonic()
        await asyncio.wait_for(resolver.settle(exchange), DEADLINE)
        waited = time.monotonic() - started
        hung = not store.gate.is_set() and store.batches == []
        # a second answer waiting on the same hung write is released by the same timer
        again = await opening(resolver, [*FIRST[:1], {"role": "user", "content": "Other."}])
        await asyncio.wait_for(resolver.settle(again), DEADLINE)
        store.gate.set()
        await resolver.done()
        return waited, hung, len(store.batches)

    waited, hung, batches = run(go)
    assert hung  # it let the answer go while the write still hung
    assert waited >= LINK_SAVE_WAIT * 0.9  # the loop's timer may fire a hair early
    assert batches == 2  # the hung batch, then the rest at the end


def test_once_a_batch_failed_answers_do_not_wait_for_the_store(
    store: RecordingStore, others_read: None
) -> None:
    async def go() -> tuple[bool, int]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        store.refusing = True
        await resolver.running()
        await opening(resolver, FIRST)  # its request's link: the batch that fails
        await until(lambda: resolver.store_errors == 1, "the first failed batch")
        second = await opening(resolver, [*FIRST[:1], {"role": "user", "content": "Other."}])
        settling = asyncio.ensure_future(resolver.settle(second))
        for _ in range(3):
            await asyncio.sleep(0)
        at_once = settling.done()
        await settling
        store.refusing = False
        await resolver.done()
        return at_once, resolver.store_errors

    at_once, errors = run(go)
    assert at_once
    assert errors >= 1


def test_a_single_proxy_leaves_the_answer_to_exchange_done(store: RecordingStore) -> None:
    """No other process reads its store: settle neither remembers nor waits, so the
    answer's assembly stays off the response path."""

    async def go() -> tuple[bool, list[list[int]]]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        exchange = await opening(resolver, [*FIRST, {"role": "assistant", "content": "In"}])
        store.gate.clear()  # a wait for the store would hang
        await asyncio.wait_for(resolver.settle(exchange), DEADLINE)
        untouched = isinstance(exchange.continuity, Pending)
        store.gate.set()
        resolver.exchange_done(exchange)  # after the relay: the answer's link
        await resolver.done()
        return untouched, [[link.turn for link in batch] for batch in store.batches]

    untouched, written = run(go)
    assert untouched
    assert [turn for batch in written for turn in batch] == [2, 2]  # request's, answer's


def test_a_pool_with_its_table_remembers_the_answer_there_and_waits_for_no_store(
    store: RecordingStore, others_read: None, tmp_path: Path
) -> None:
    async def go() -> tuple[bool, bool, bool, int]:
        table = LinkTable(create_table(str(tmp_path)))
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW, table=table)
        await resolver.running()
        store.gate.clear()  # any wait for the store would hang
        prefill = await opening(resolver, [*FIRST, {"role": "assistant", "content": "In"}])
        plain = await opening(resolver, FIRST)
        both = asyncio.gather(resolver.settle(prefill), resolver.settle(plain))
        for _ in range(5):
            await asyncio.sleep(0)
        at_once = both.done()
        await both
        written = store.attempts  # nothing tried: the table serves the other workers
        store.gate.set()
        await resolver.done()
        return at_once, prefill.continuity is None, plain.continuity is None, written

    at_once, prefill_remembered, plain_remembered, written = run(go)
    assert at_once
    assert prefill_remembered  # its answer's link goes to the table for the next turn
    assert not plain_remembered  # the request's own link serves its next turn
    assert written == 0


def test_an_answer_waits_for_the_batch_under_way_not_another(
    store: RecordingStore, others_read: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's link is being written when the answer ends: the answer waits for that
    write alone. Every later write hangs, and LINK_SAVE_WAIT is longer than the test waits,
    so an answer that waited on any other batch would not be let go."""
    monkeypatch.setattr(resolver_module, "LINK_SAVE_WAIT", LONG_WINDOW)

    async def go() -> None:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        store.gate.clear()
        exchange = await opening(resolver, FIRST)
        await until(lambda: store.attempts == 1, "the request's link being written")
        settling = asyncio.ensure_future(resolver.settle(exchange))
        assert await stays(lambda: not settling.done())
        store.hang_after = 1
        store.gate.set()
        await asyncio.wait_for(settling, DEADLINE)
        store.hang_after = None
        store.later_gate.set()
        await resolver.done()

    run(go)
    assert len(store.batches) >= 1


def test_answers_that_must_wait_share_the_next_batch(
    store: RecordingStore, others_read: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two answers end before the writer runs: both wait for the one batch it writes next."""
    monkeypatch.setattr(resolver_module, "LINK_SAVE_WAIT", LONG_WINDOW)

    async def go() -> int:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        first = await opening(resolver, FIRST)
        second = await opening(resolver, [FIRST[0], {"role": "user", "content": "Other."}])
        await asyncio.wait_for(
            asyncio.gather(resolver.settle(first), resolver.settle(second)), DEADLINE
        )
        batches = len(store.batches)
        await resolver.done()
        return batches

    assert run(go) == 1


def answered(
    pending: Pending, status: int = 200, error: str | None = None, cut: bool = False
) -> Exchange:
    exchange = exchange_for(pending)
    exchange.status, exchange.error = status, error
    if cut:
        exchange.chunks.dropped = 1  # type: ignore[attr-defined]  # its middle not kept
    return exchange


@pytest.mark.parametrize(
    ("status", "error", "cut", "links"),
    [
        (200, None, False, 2),  # the request's link and the answer's
        # no answer the client has to resend: only the request's own link
        (500, None, False, 1),
        (200, "stream_broken", False, 1),
        (200, None, True, 1),
    ],
)
def test_only_a_whole_served_answer_is_linked(
    store: RecordingStore, status: int, error: str | None, cut: bool, links: int
) -> None:
    async def go() -> int:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        identity = await resolver.identify({}, {"model": MODEL, "messages": FIRST}, MODEL, ROUTE)
        assert identity.pending is not None
        resolver.exchange_done(answered(identity.pending, status, error, cut))
        await resolver.done()
        return sum(len(batch) for batch in store.batches)

    assert run(go) == links


@pytest.mark.parametrize(
    ("conversation", "pair_id", "given", "expected"),
    [
        ("user:alice", None, "", "hashed"),  # an answer learns its stored name
        # a copy keeps its answer's, even none (the keys were not read when it was made)
        ("user:alice", "req-0", "", ""),
        ("user:alice", None, "k:given", "k:given"),  # known already: kept
        ("", None, "", ""),  # nothing named: nothing to store it by
    ],
)
def test_each_exchange_learns_its_conversation_as_the_store_keys_it(
    store: RecordingStore, conversation: str, pair_id: str | None, given: str, expected: str
) -> None:
    async def go() -> str:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        await until(lambda: resolver.in_store("user:alice") != "", "the store's keys read")
        exchange = Exchange(
            "req-1", ROUTE, "vllm", SERVE, MODEL, MODEL, conversation, 1, False,
            time.perf_counter(), status=200, pair_id=pair_id, conversation_in_store=given,
        )  # fmt: skip
        resolver.exchange_done(exchange)
        await resolver.done()
        return exchange.conversation_in_store

    stored = run(go)
    assert stored == (store.keys.conversation("user:alice") if expected == "hashed" else expected)


def test_a_long_answer_that_must_be_found_is_linked_before_its_last_byte(
    store: RecordingStore, others_read: None
) -> None:
    """An assistant prefill is continued by its answer, so the answer's link must be in the
    store when the client has the answer: a long one is reassembled a slice at a time."""
    long_text = "word " * 80_000  # over one slice (wire.assemble.SLICE_BYTES)

    async def go() -> tuple[bool, int]:
        resolver = ContinuityResolver(store, batch_s=LONG_WINDOW)
        await resolver.running()
        prefill = [*FIRST, {"role": "assistant", "content": "In"}]
        identity = await resolver.identify({}, {"model": MODEL, "messages": prefill}, MODEL, ROUTE)
        assert identity.pending is not None
        exchange = exchange_for(identity.pending)
        exchange.chunks.clear()
        body = {"choices": [{"message": {"role": "assistant", "content": long_text}}]}
        exchange.chunks.append(json.dumps(body).encode())
        assert exchange.long_answer
        await asyncio.wait_for(resolver.settle(exchange), DEADLINE)
        stored = sum(len(batch) for batch in store.batches)
        await resolver.done()
        return exchange.continuity is None, stored

    assert run(go) == (True, 2)  # remembered, and both links written when settle returned


def test_a_store_read_that_hangs_reads_as_a_miss_after_the_timeout(
    store: RecordingStore,
) -> None:
    async def go() -> str:
        writer = ContinuityResolver(store, 60.0)
        opened = await opening(writer, FIRST)
        writer.exchange_done(opened)
        await writer.done()
        store.load_gate.clear()
        reader = ContinuityResolver(store, remote_timeout=0.05)
        later = await asyncio.wait_for(
            reader.identify({}, {"model": MODEL, "messages": LATER}, MODEL, ROUTE), DEADLINE / 2
        )
        store.load_gate.set()
        return later.source

    assert run(go) == "guess"


def test_a_shared_store_is_read_once_more_for_a_link_another_proxy_is_writing(
    store: RecordingStore,
) -> None:
    """On Redis another proxy writes its answer's link as the answer ends, and its client
    may be quicker: a miss is read again a moment later."""

    async def go() -> str:
        elsewhere = ContinuityResolver()  # the other proxy, which served the first turn
        opened = await elsewhere.identify({}, {"model": MODEL, "messages": FIRST}, MODEL, ROUTE)
        assert opened.pending is not None
        answer_link = elsewhere.remember(opened.pending, {"choices": [{"message": ANSWER}]})
        assert answer_link is not None
        keys = store.keys
        store.late = [
            Link(keys.key(answer_link), keys.conversation(opened.conversation), 1, time.time() + 60)
        ]
        store.url = "redis://links-host/0"  # shared: only the URL's scheme is read for this
        reader = ContinuityResolver(store)
        later = await reader.identify({}, {"model": MODEL, "messages": LATER}, MODEL, ROUTE)
        return later.source

    assert run(go) == "continuity"


def test_a_store_whose_keys_cannot_be_read_yet_does_not_stop_the_writer(
    store: RecordingStore,
) -> None:
    """A Redis store reads its secret at first use, and may be down when the proxy starts:
    the writer keeps its links and writes them once the store answers."""
    supervisor = Supervisor(backoff_s=0.01)

    async def go() -> list[list[str]]:
        store.keys_down = True
        resolver = ContinuityResolver(store, supervisor=supervisor)  # retried in a second
        await resolver.running()
        resolver.save(link_while_down(store, "kept"))
        await until(lambda: resolver.store_errors >= 1, "a batch refused")
        store.keys_down = False
        await until(lambda: len(store.batches) == 1, "the batch written")
        await resolver.done()
        return store.written()

    assert run(go) == [["kept"]]
    assert supervisor.restarts == {}


def link_while_down(store: RecordingStore, name: str) -> Link:
    store.keys_down, down = False, store.keys_down
    try:
        return link(store, name)
    finally:
        store.keys_down = down


def test_a_link_read_from_the_pools_table_is_kept_in_process(
    store: RecordingStore, tmp_path: Path
) -> None:
    async def go() -> list[str]:
        path = create_table(str(tmp_path / "first"))
        worker = ContinuityResolver(table=LinkTable(path))
        opened = await worker.identify({}, {"model": MODEL, "messages": FIRST}, MODEL, ROUTE)
        assert opened.pending is not None
        worker.remember(opened.pending, {"choices": [{"message": ANSWER}]})
        other = ContinuityResolver(table=LinkTable(path))  # another worker of the pool
        sources = [
            (await other.identify({}, {"model": MODEL, "messages": LATER}, MODEL, ROUTE)).source
        ]
        other.table = LinkTable(create_table(str(tmp_path / "second")))  # a table that forgot
        again = await other.identify({}, {"model": MODEL, "messages": LATER}, MODEL, ROUTE)
        return [*sources, again.source]

    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    assert run(go) == ["continuity", "continuity"]
