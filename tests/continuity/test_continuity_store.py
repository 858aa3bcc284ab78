"""Conversation links in the rollout store (SQLite and Redis) and the resolver in front of it:
a conversation started behind one proxy continues behind another sharing the store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from kvmigrate.continuity.chains import ChainMap
from kvmigrate.continuity.link_table import LinkTable, create_table
from kvmigrate.continuity.resolver import (
    LINK_BATCH_MAX,
    LINK_BATCH_S,
    LOCAL_LINK_BATCH_S,
    ContinuityResolver,
    Identity,
)
from kvmigrate.exchange import SERVE, Exchange
from kvmigrate.policies.chain import RESPONSE_PREFIX, ChainEntry
from kvmigrate.policies.continuity import answer_digest, encode
from kvmigrate.rollout.state import Link, Pin, RolloutState
from kvmigrate.rollout.store import StoreError, open_store


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.redis)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    url: str = request.getfixturevalue("fresh_redis_url")
    return url


def test_links_are_kept_replaced_and_expire(store_url: str) -> None:
    store = open_store(store_url, RolloutState())
    now = time.time()
    store.save_links([Link("c:a", "conv-1", 1, now + 60), Link("c:old", "conv-2", 3, now - 1, "x")])
    store.save_links([Link("c:a", "conv-1", 2, now + 60, "d")])
    assert store.load_links(["c:a", "c:old", "c:none"]) == [Link("c:a", "conv-1", 2, now + 60, "d")]
    assert store.load_links([]) == []
    store.close()


def test_a_batch_of_many_links_is_saved_whole_and_a_later_duplicate_wins(store_url: str) -> None:
    """More links than one statement takes (the SQLite store splits them), with keys repeated
    across the split: every key is kept once, at its last value in the batch."""
    store = open_store(store_url, RolloutState())
    now = time.time()
    links = [Link(f"c:{i}", f"conv-{i}", 1, now + 60) for i in range(450)]
    links += [Link(f"c:{i}", f"conv-{i}", 2, now + 60, "last") for i in range(0, 450, 7)]
    store.save_links(links)
    loaded = {link.key: link for link in store.load_links([f"c:{i}" for i in range(460)])}
    assert len(loaded) == 450
    assert loaded["c:0"] == Link("c:0", "conv-0", 2, now + 60, "last")
    assert loaded["c:448"] == Link("c:448", "conv-448", 2, now + 60, "last")
    assert loaded["c:449"] == Link("c:449", "conv-449", 1, now + 60)
    store.close()


def test_a_link_batch_sweeps_expired_links_and_a_failed_one_is_a_store_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = open_store(f"sqlite:///{path}", RolloutState())
    now = time.time()
    store.save_links([Link("c:old", "conv-1", 1, now - 1), Link("c:new", "conv-2", 1, now + 60)])
    store.close()
    # A fresh store sweeps at its first batch.
    store = open_store(f"sqlite:///{path}", RolloutState())
    store.save_links([Link("c:b", "conv-3", 1, now + 60)])
    with sqlite3.connect(path) as db:
        kept = sorted(row[0] for row in db.execute("SELECT key FROM rollout_links"))
    assert kept == ["c:b", "c:new"]
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE rollout_links")
    with pytest.raises(StoreError, match="rollout store"):
        store.save_links([Link("c:c", "conv-4", 1, now + 60)])
    store.close()


def test_an_existing_sqlite_store_gains_the_link_table_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)
    old.executescript(
        "CREATE TABLE rollout_state (id INTEGER PRIMARY KEY CHECK (id = 1), data TEXT NOT NULL,"
        " version INTEGER NOT NULL);"
        "CREATE TABLE rollout_history (version INTEGER PRIMARY KEY, at REAL NOT NULL,"
        " data TEXT NOT NULL);"
        "CREATE TABLE rollout_pins (conversation TEXT PRIMARY KEY, backend TEXT NOT NULL,"
        " epoch INTEGER NOT NULL, expires_at REAL NOT NULL);"
        "INSERT INTO rollout_pins VALUES ('kept', 'vllm', 0, 9e12);"
    )
    old.commit()
    old.close()
    store = open_store(f"sqlite:///{path}", RolloutState())
    # The pin written in the clear is hashed in place (kvmigrate.rollout.keys).
    assert store.load_pins() == [Pin(store.keys.key("kept"), "vllm", 0, 9e12)]
    store.save_links([Link("c:a", "kept", 1, time.time() + 60)])
    assert [link.conversation for link in store.load_links(["c:a"])] == ["kept"]
    store.close()


def chat(now: str, *rest: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"Be brief. Context block: {now} weather=sunny"},
            {"role": "user", "content": "Plan my day"},
            *rest,
        ],
    }


def answer(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


async def stored(resolver: ContinuityResolver, link: str) -> None:
    """Until the resolver's background writer has put `link` in the store (a poll of the
    store itself, not a fixed sleep), within a generous 10 s."""
    assert resolver.store is not None
    async with asyncio.timeout(10):
        # The store has no event to wait on, only its contents: poll them.
        # The store keeps the link under its keyed hash (kvmigrate.rollout.keys).
        key = resolver.store.keys.key(link)
        while not await asyncio.to_thread(resolver.store.load_links, [key]):  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def _two_proxies(store_url: str) -> list[tuple[str, int, str]]:
    """Turns alternate between two resolvers sharing one store; each answer is remembered
    where it was served, and written to the store in the background."""
    resolvers = [ContinuityResolver(open_store(store_url, RolloutState()), 60.0) for _ in "ab"]
    for r in resolvers:
        await r.running()
    seen = []
    history: list[dict[str, Any]] = []
    for turn in range(1, 5):
        resolver = resolvers[turn % 2]
        # A retrieved-context block that changes every turn and is no timestamp: masking
        # cannot help, continuity must.
        body = chat(f"doc-{turn * 7919 % 1000}-{'xyz'[turn % 3]}", *history)
        identity = await resolver.identify({}, body, "m", "chat/completions")
        seen.append((identity.conversation, identity.turn, identity.source))
        assert identity.pending is not None
        link = resolver.remember(identity.pending, answer(f"answer {turn}"))
        assert link is not None
        await stored(resolver, link)  # the writer's batch reaches the store
        history += [{"role": "assistant", "content": f"answer {turn}"}]
        history += [{"role": "user", "content": f"and then {turn}?"}]
    for r in resolvers:
        await r.done()
        assert r.store is not None
        r.store.close()
    return seen


def test_a_conversation_started_behind_one_proxy_continues_behind_another(
    store_url: str,
) -> None:
    seen = asyncio.run(_two_proxies(store_url))
    assert len({conversation for conversation, _, _ in seen}) == 1
    assert [(turn, source) for _, turn, source in seen] == [
        (1, "opening"),
        (2, "continuity"),
        (3, "continuity"),
        (4, "continuity"),
    ]


def test_without_a_match_a_later_turn_is_a_guess_by_its_masked_opening() -> None:
    async def run() -> tuple[Any, Any, Any]:
        resolver = ContinuityResolver()
        first = await resolver.identify({}, chat("2026-01-01 10:00"), "m", "chat/completions")
        # An agent that summarised its history: nothing before its last answer was seen.
        trimmed = chat(
            "2026-01-01 10:05",
            {"role": "user", "content": "(summary of the day so far)"},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "Next?"},
        )
        later = await resolver.identify({}, trimmed, "m", "chat/completions")
        declared = await resolver.identify({"x-session-id": "s1"}, trimmed, "m", "chat/completions")
        return first, later, declared

    first, later, declared = asyncio.run(run())
    assert (first.source, later.source, declared.source) == ("opening", "guess", "header")
    assert later.conversation == first.conversation
    assert declared.conversation == "s1"
    assert declared.pending is None


def test_a_next_turn_that_outruns_the_answer_link_continues_by_the_request_link(
    store_url: str,
) -> None:
    """The client's next turn reaches proxy B before proxy A has linked the answer: A linked
    the request itself when it arrived, and that is enough."""

    async def run() -> tuple[Any, Any]:
        a, b = (ContinuityResolver(open_store(store_url, RolloutState()), 60.0) for _ in "ab")
        await a.running()
        first = await a.identify({}, chat("ctx-alpha"), "m", "chat/completions")
        assert first.pending is not None
        # The request link reaches the store; no answer link yet.
        await stored(a, first.pending.history.request_link)
        later = chat(
            "ctx-beta",
            {"role": "assistant", "content": "Start at nine."},
            {"role": "user", "content": "Then?"},
        )
        second = await b.identify({}, later, "m", "chat/completions")
        for r in (a, b):
            await r.done()
            assert r.store is not None
            r.store.close()
        return first, second

    first, second = asyncio.run(run())
    assert (second.conversation, second.turn, second.source) == (
        first.conversation,
        2,
        "continuity",
    )


def _served(identity: Identity, response: dict[str, Any]) -> Exchange:
    """The exchange of an answer served whole, as the proxy hands it to `settle`."""
    exchange = Exchange(
        "r", "chat/completions", "hosted", SERVE, "m", "m", identity.conversation, 1, False, 0.0
    )
    exchange.status, exchange.chunks = 200, [orjson.dumps(response)]
    exchange.continuity = identity.pending
    return exchange


def test_an_answer_waits_only_until_its_next_turn_can_be_found(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where another process reads the store (here `proxy --workers`, or Redis), an answer's
    last byte waits until the next turn can find its conversation there. The request's own
    link, written while the upstream answered, is enough: that answer goes at once and is
    remembered after the relay. An assistant prefill, which the next turn cannot find by its
    request, waits for its answer's own link."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    async def run() -> None:
        a, b = (ContinuityResolver(open_store(store_url, RolloutState()), 60.0) for _ in "ab")
        assert a.others_read
        await a.running()
        first = await a.identify({}, chat("ctx-alpha"), "m", "chat/completions")
        assert first.pending is not None
        # A conversation the client declares needs no link: its answer never waits, even
        # with links still on their way.
        declared = await a.identify({"x-session-id": "s-1"}, chat("ctx"), "m", "chat/completions")
        with pytest.raises(StopIteration):
            a.settle(_served(declared, answer("Hi."))).send(None)
        await stored(a, first.pending.history.request_link)
        exchange = _served(first, answer("Start at nine."))
        with pytest.raises(StopIteration):  # done without waiting for anything
            a.settle(exchange).send(None)
        assert exchange.continuity is first.pending  # left for `exchange_done`
        a.exchange_done(exchange)
        later = chat(
            "ctx-beta",
            {"role": "assistant", "content": "Start at nine."},
            {"role": "user", "content": "Then?"},
        )
        second = await b.identify({}, later, "m", "chat/completions")
        assert (second.conversation, second.turn) == (first.conversation, 2)
        assert second.source == "continuity"

        prefill = chat("ctx-gamma", {"role": "assistant", "content": "Sure, from"})
        third = await a.identify({}, prefill, "m", "chat/completions")
        assert third.pending is not None
        await stored(a, third.pending.history.request_link)
        waiting = asyncio.create_task(a.settle(_served(third, answer(" nine."))))
        await asyncio.sleep(0)
        assert not waiting.done()
        await waiting
        link = answer_digest(third.pending.history.hasher, [encode("assistant", " nine.")])
        assert a.store is not None
        assert await asyncio.to_thread(a.store.load_links, [a.store.keys.key(link)])
        for r in (a, b):
            await r.done()
            assert r.store is not None
            r.store.close()

    asyncio.run(run())


def test_a_single_proxy_gathers_its_links_and_a_full_batch_goes_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no other process reads the links, they are only for the next start: they
    gather for the resolver's window. A lone link after a quiet spell goes at once, the
    next ones wait, LINK_BATCH_MAX of them go at once, and what is left goes at shutdown."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    url = f"sqlite:///{tmp_path}/state.db"
    assert ContinuityResolver(open_store(url, RolloutState())).batch_s == LOCAL_LINK_BATCH_S
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # `proxy --workers N`
    assert ContinuityResolver(open_store(url, RolloutState())).batch_s == LINK_BATCH_S
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")

    def link(key: str) -> Link:
        return Link(key, "h:0123456789abcdef01234567", 1, time.time() + 60)

    async def in_store(resolver: ContinuityResolver, key: str) -> bool:
        assert resolver.store is not None
        found = await asyncio.to_thread(resolver.store.load_links, [resolver.store.keys.key(key)])
        return bool(found)

    async def run() -> None:
        resolver = ContinuityResolver(open_store(url, RolloutState()), batch_s=3600.0)
        await resolver.running()
        resolver.save(link("c:first"))
        await stored(resolver, "c:first")
        resolver.save(link("c:second"))
        await asyncio.sleep(0.05)
        assert not await in_store(resolver, "c:second")  # gathering, for an hour
        for n in range(LINK_BATCH_MAX - 1):
            resolver.save(link(f"c:burst-{n}"))
        await stored(resolver, f"c:burst-{LINK_BATCH_MAX - 2}")
        assert await in_store(resolver, "c:second")
        resolver.save(link("c:last"))
        await resolver.done()
        assert await in_store(resolver, "c:last")
        assert resolver.store is not None
        resolver.store.close()

    asyncio.run(run())


def test_a_closed_sqlite_store_refuses_links(tmp_path: Path) -> None:
    """Links have a connection of their own: closing the store closes it too, and a batch
    after that fails as any write to a closed store does, instead of reopening the file."""
    link = Link("c:a", "h:0123456789abcdef01234567", 1, time.time() + 60)
    for batches_before in (0, 1):  # the links' connection never opened, and opened
        store = open_store(f"sqlite:///{tmp_path}/state-{batches_before}.db", RolloutState())
        for _ in range(batches_before):
            store.save_links([link])
        store.close()
        with pytest.raises(StoreError):
            store.save_links([link])


def test_a_response_id_kept_by_one_worker_is_found_by_another_a_moment_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`proxy --workers N` share one SQLite store. A response id goes there after the
    client already has the answer: a worker asked for it before it lands reads again a
    moment later, as a proxy sharing Redis does. (Here the id is kept only after the other
    worker's first read, which cannot have found it.)"""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))  # as the workers run
    url = f"sqlite:///{tmp_path}/state.db"

    async def run() -> tuple[ChainEntry | None, str]:
        one, other = (ChainMap(ContinuityResolver(open_store(url, RolloutState()))) for _ in "ab")
        await one.links.running()
        finding = asyncio.create_task(other.find(RESPONSE_PREFIX + "resp_1"))
        await asyncio.sleep(0.02)  # its first read is done, and missed
        one.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("conv-1", 1, "vllm"))
        found = await finding
        assert one.links.store is not None
        kept_as = one.links.store.keys.conversation("conv-1")  # the store's keyed hash
        for chains in (one, other):
            await chains.links.done()
            assert chains.links.store is not None
            chains.links.store.close()
        return found, kept_as

    found, kept_as = asyncio.run(run())
    assert found is not None
    assert (found.conversation, found.turn, found.backend) == (kept_as, 1, "vllm")


def test_answers_do_not_wait_on_a_store_that_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a batch of links has failed, answers stop waiting for the store until one is
    written again (the writer retries each second): a broken store costs continuity across
    processes, never every answer a second."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    store = open_store(f"sqlite:///{tmp_path}/state.db", RolloutState())
    store.save_links([Link("c:warm", "conv-0", 1, time.time() + 60)])  # the links' connection
    store.close()  # every later write fails, as a lost volume's would

    async def run() -> None:
        resolver = ContinuityResolver(store, 60.0)
        await resolver.running()
        prefill = chat("ctx", {"role": "assistant", "content": "Sure, from"})
        identity = await resolver.identify({}, prefill, "m", "chat/completions")
        async with asyncio.timeout(10):
            # The request's own link is written at once; its failure is only counted.
            while not resolver.store_errors:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        with pytest.raises(StopIteration):  # a prefill, yet nothing to wait for
            resolver.settle(_served(identity, answer(" nine."))).send(None)
        await resolver.done()

    asyncio.run(run())


def test_a_response_id_goes_to_the_store_at_once_and_takes_waiting_links_along(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where workers share the store, an answer's link is in no hurry (the request's own
    link already finds the next turn) and gathers for the writer's window; a response id
    is asked for as soon as the client has the answer, and goes at once, with whatever
    gathered. The window here is an hour, so only that can have written them."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    async def run() -> None:
        store = open_store(f"sqlite:///{tmp_path}/state.db", RolloutState())
        resolver = ContinuityResolver(store, 60.0, batch_s=3600.0)
        chains = ChainMap(resolver)
        await resolver.running()
        resolver.save(Link("c:answer", "conv-1", 2, time.time() + 60))
        await asyncio.sleep(0.05)
        assert not await asyncio.to_thread(store.load_links, [store.keys.key("c:answer")])
        chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("conv-1", 2, "vllm"))
        await stored(resolver, RESPONSE_PREFIX + "resp_1")
        assert await asyncio.to_thread(store.load_links, [store.keys.key("c:answer")])
        await resolver.done()
        store.close()

    asyncio.run(run())


def test_workers_sharing_a_table_continue_each_others_conversations_without_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two resolvers as two workers of one pool: the store writes only every hour here, so
    what the second finds, it found in the table. The first's answers never wait for a
    write, and an assistant prefill, which its next turn finds by the answer's own link,
    has that link made before the answer's last byte."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    path = create_table(str(tmp_path))
    url = f"sqlite:///{tmp_path}/state.db"

    def worker(batch_s: float | None = 3600.0) -> ContinuityResolver:
        return ContinuityResolver(
            open_store(url, RolloutState()), 60.0, batch_s=batch_s, table=LinkTable(path)
        )

    assert worker(None).batch_s == LOCAL_LINK_BATCH_S  # the store is for the next start
    assert ContinuityResolver(open_store(url, RolloutState())).batch_s == LINK_BATCH_S

    async def run() -> None:
        a, b = worker(), worker()
        await a.running()
        first = await a.identify({}, chat("ctx-alpha"), "m", "chat/completions")
        exchange = _served(first, answer("Start at nine."))
        with pytest.raises(StopIteration):  # the answer waits for nothing
            a.settle(exchange).send(None)
        later = chat(
            "ctx-beta",
            {"role": "assistant", "content": "Start at nine."},
            {"role": "user", "content": "Then?"},
        )
        second = await b.identify({}, later, "m", "chat/completions")
        assert (second.conversation, second.turn, second.source) == (
            first.conversation,
            2,
            "continuity",
        )

        prefill = chat("ctx-gamma", {"role": "assistant", "content": "Sure, from"})
        third = await a.identify({}, prefill, "m", "chat/completions")
        assert third.pending is not None
        with pytest.raises(StopIteration):
            a.settle(_served(third, answer(" nine."))).send(None)
        link = answer_digest(third.pending.history.hasher, [encode("assistant", " nine.")])
        assert b.table is not None
        assert b.table.get(link) == (third.conversation, third.turn)
        assert a.store is not None
        assert await asyncio.to_thread(a.store.load_links, [a.store.keys.key(link)]) == []
        await a.done()  # what the table holds reaches the store for the next start
        assert await asyncio.to_thread(a.store.load_links, [a.store.keys.key(link)])
        for r in (a, b):
            assert r.store is not None
            r.store.close()

    asyncio.run(run())


def test_a_redis_store_is_read_by_other_machines_so_it_is_not_bypassed(
    fresh_redis_url: str, tmp_path: Path
) -> None:
    resolver = ContinuityResolver(
        open_store(fresh_redis_url, RolloutState()),
        table=LinkTable(create_table(str(tmp_path))),
    )
    assert resolver.table is None
    assert resolver.batch_s == LINK_BATCH_S
    assert resolver.store is not None
    resolver.store.close()
