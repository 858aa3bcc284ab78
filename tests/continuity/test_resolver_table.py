"""`continuity/resolver.py`'s identity, row by row: what conversation, turn and source each
kind of request gets (declared, no history, a first turn, a later turn found or guessed),
how the sources are counted into Prometheus, and that a link read from the store is kept
here. The end-to-end paths (proxies, pools, Redis) are in tests/continuity/test_lookup_paths.py
and test_continuity_store.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvmigrate.continuity.resolver import SOURCES, ContinuityResolver, Identity
from kvmigrate.policies.conversation import derived_key
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import open_store

MODEL = "gpt-4o-mini"
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
FIRST = [SYSTEM, {"role": "user", "content": "Find where the config is parsed."}]
ANSWER = {"role": "assistant", "content": "In kvmigrate/config/load.py."}
LATER = [*FIRST, ANSWER, {"role": "user", "content": "And the defaults?"}]


def chat(messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **extra}


def derived(body: dict[str, Any], model: str = MODEL) -> str:
    return derived_key(body, model).value


def identify(
    resolver: ContinuityResolver,
    body: dict[str, Any],
    route: str = "chat/completions",
    headers: dict[str, str] | None = None,
    model: str = MODEL,
) -> Identity:
    return asyncio.run(resolver.identify(headers or {}, body, model, route))


@pytest.mark.parametrize(
    ("route", "body", "headers", "conversation", "turn", "source", "pending"),
    [
        # declared: the session header, else `user`, whatever the history; no link needed
        ("chat/completions", chat(LATER), {"x-session-id": "s-1"}, "s-1", 2, "header", False),
        ("chat/completions", chat(FIRST, user="u-7"), {}, "user:u-7", 1, "user", False),
        # Anthropic's Messages API has no `user`: its metadata.user_id declares; chat's
        # metadata is free-form tags
        ("messages", chat(FIRST, metadata={"user_id": "u-8"}), {}, "user:u-8", 1, "user", False),
        (
            "chat/completions",
            chat(FIRST, metadata={"user_id": "u-8"}),
            {},
            "derived",
            1,
            "opening",
            True,
        ),
        # no history on this route: keyed by the body, an opening where it has a prefix
        ("embeddings", {"model": MODEL, "input": "hello"}, {}, "derived", 1, "body", False),
        ("completions", {"model": MODEL, "prompt": "once"}, {}, "derived", 1, "body", False),
        ("embeddings", chat(FIRST), {}, "derived", 1, "opening", False),
        ("chat/completions", {"model": MODEL}, {}, "derived", 1, "body", False),
        # a history: its first turn opens, a later one nobody linked is a guess; both will
        # link their answers
        ("chat/completions", chat(FIRST), {}, "derived", 1, "opening", True),
        ("chat/completions", chat(LATER), {}, "derived", 2, "guess", True),
    ],
)
def test_the_identity_of_each_kind_of_request(
    route: str,
    body: dict[str, Any],
    headers: dict[str, str],
    conversation: str,
    turn: int,
    source: str,
    pending: bool,
) -> None:
    resolver = ContinuityResolver()
    identity = identify(resolver, body, route, headers)
    expected = derived(body) if conversation == "derived" else conversation
    assert (identity.conversation, identity.turn, identity.source) == (expected, turn, source)
    assert (identity.pending is not None) == pending
    assert resolver.counts == {s: int(s == source) for s in SOURCES}


def test_the_model_is_part_of_a_derived_key() -> None:
    resolver = ContinuityResolver()
    for route, body in (
        ("embeddings", {"model": MODEL, "input": "x"}),
        ("chat/completions", chat(LATER)),
    ):
        one = identify(resolver, body, route).conversation
        other = identify(resolver, body, route, model="other-model").conversation
        assert one != other
        assert (one, other) == (derived(body), derived(body, "other-model"))


def test_a_later_turn_continues_the_conversation_its_answer_was_linked_to() -> None:
    resolver = ContinuityResolver()
    first = identify(resolver, chat(FIRST, user="u-1"))  # declared: no link of ours needed
    opening = identify(resolver, chat(FIRST))
    assert opening.pending is not None
    assert first.pending is None
    resolver.remember(opening.pending, {"choices": [{"message": ANSWER}]})
    later = identify(resolver, chat(LATER))
    assert (later.conversation, later.turn, later.source) == (opening.conversation, 2, "continuity")
    assert later.pending is not None
    assert (later.pending.conversation, later.pending.turn) == (opening.conversation, 2)


def test_the_sources_are_folded_into_prometheus_by_the_difference() -> None:
    registry = CollectorRegistry()
    resolver = ContinuityResolver()
    resolver.fold_counts()  # before the proxy registers its metrics: nothing to fold into
    resolver.register_metrics(registry)

    def counted() -> dict[str, float]:
        return {
            s: registry.get_sample_value("kvmigrate_conversation_identity_total", {"source": s})
            or 0.0
            for s in SOURCES
        }

    identify(resolver, chat(FIRST))
    identify(resolver, chat(FIRST), headers={"x-session-id": "a"})
    assert set(counted().values()) == {0.0}  # counted in a dict until a fold
    resolver.fold_counts()
    assert counted() == {s: float(s in ("opening", "header")) for s in SOURCES}
    resolver.fold_counts()  # nothing new: nothing added
    identify(resolver, chat(LATER))  # found by the first turn's own link
    identify(resolver, chat(LATER))
    identify(resolver, chat(FIRST))  # a source folded before: only its new count is added
    resolver.fold_counts()
    assert counted() == {
        s: {"opening": 2.0, "header": 1.0, "continuity": 2.0}.get(s, 0.0) for s in SOURCES
    }
    text = generate_latest(registry).decode()
    assert (
        "# HELP kvmigrate_conversation_identity_total Requests by how their conversation was "
        "identified: header, user, continuity (an earlier answer resent), opening (a first "
        "turn), guess (a later turn keyed by its masked opening only), body (no messages), "
        "chain (a Responses request continuing a stored response).\n"
    ) in text
    assert 'kvmigrate_conversation_identity_total{source="chain"} 0.0\n' in text


def forget_links(url: str) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute("DELETE FROM rollout_links")


def test_a_link_read_from_the_store_is_kept_here(sqlite_url: str) -> None:
    """The next lookup of a link this process read from the store needs the store no more:
    with the link gone from the store, the turn after is still found."""
    store = open_store(sqlite_url, RolloutState())

    async def go() -> list[Identity]:
        writer = ContinuityResolver(store, 60.0)
        opening = await writer.identify({}, chat(FIRST), MODEL, "chat/completions")
        assert opening.pending is not None
        writer.remember(opening.pending, {"choices": [{"message": ANSWER}]})
        await writer.done()  # its links written
        reader = ContinuityResolver(store, 60.0)
        found = await reader.identify({}, chat(LATER), MODEL, "chat/completions")
        forget_links(sqlite_url)
        again = await reader.identify({}, chat(LATER), MODEL, "chat/completions")
        fresh = await ContinuityResolver(store, 60.0).identify(
            {}, chat(LATER), MODEL, "chat/completions"
        )
        return [opening, found, again, fresh]

    try:
        opening, found, again, fresh = asyncio.run(go())
    finally:
        store.close()
    assert (found.conversation, found.turn, found.source) == (opening.conversation, 2, "continuity")
    assert (again.conversation, again.turn, again.source) == (opening.conversation, 2, "continuity")
    assert (fresh.turn, fresh.source) == (2, "guess")  # the store did forget it


def conversation(name: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """A conversation's first turn, and its second after ANSWER."""
    first = [SYSTEM, {"role": "user", "content": f"Task {name}: go."}]
    return first, [*first, ANSWER, {"role": "user", "content": "Next."}]


@pytest.mark.parametrize(
    ("max_local", "found"),
    [
        (8, {"a": "continuity", "b": "continuity"}),
        # a conversation holds two links (its request's and its answer's), and a later turn
        # looked up one more; the least recently used go first, and `a` was looked up
        # before `c` began, so `b`'s went
        (4, {"a": "continuity", "b": "guess"}),
        (2, {"a": "guess", "b": "guess"}),
    ],
)
def test_this_process_keeps_the_most_recently_used_links(
    max_local: int, found: dict[str, str]
) -> None:
    resolver = ContinuityResolver(max_local=max_local)

    def start(name: str) -> None:
        opening = identify(resolver, chat(conversation(name)[0]))
        assert opening.pending is not None
        resolver.remember(opening.pending, {"choices": [{"message": ANSWER}]})

    start("a")
    start("b")
    looked_up = identify(resolver, chat(conversation("a")[1])).source
    assert looked_up == ("guess" if max_local == 2 else "continuity")
    start("c")
    seen = {name: identify(resolver, chat(conversation(name)[1])).source for name in "ab"}
    assert seen == found


def test_a_declared_conversation_is_known_to_the_store_by_its_keyed_hash(sqlite_url: str) -> None:
    store = open_store(sqlite_url, RolloutState())

    async def go() -> tuple[str, str, str]:
        resolver = ContinuityResolver(store, 60.0)
        before = resolver.in_store("user:alice")  # the store's keys not read yet
        await resolver.running()
        for _ in range(200):
            if resolver.in_store("user:alice"):
                break
            await asyncio.sleep(0.01)
        derived_key = derived(chat(FIRST))
        answer = (before, resolver.in_store("user:alice"), resolver.in_store(derived_key))
        await resolver.done()
        return answer

    try:
        before, declared, derived_one = asyncio.run(go())
        assert before == ""
        assert declared == store.keys.conversation("user:alice") != "user:alice"
        assert derived_one == ""  # a derived key is a hash already: kept as it is
    finally:
        store.close()
    assert ContinuityResolver().in_store("user:alice") == ""  # no store: the key itself


def test_links_a_failing_store_refused_are_kept_and_written_once_it_recovers(
    sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The links' table gone (as a full disk or a lost volume would refuse writes): the
    writer counts each failed batch, logs the first, keeps its links and tries again a
    second later; with the table back, they are written."""
    path = sqlite_url.removeprefix("sqlite:///")
    store = open_store(sqlite_url, RolloutState())

    def rename(old: str, new: str) -> None:
        with sqlite3.connect(path) as db:
            db.execute(f"ALTER TABLE {old} RENAME TO {new}")

    async def go() -> tuple[int, bool]:
        resolver = ContinuityResolver(store, 60.0)
        await resolver.running()
        rename("rollout_links", "rollout_links_away")
        opening = await resolver.identify({}, chat(FIRST), MODEL, "chat/completions")
        assert opening.pending is not None
        resolver.remember(opening.pending, {"choices": [{"message": ANSWER}]})
        logged = []
        for errors in (1, 2):  # the first failed batch, logged; its retry a second later
            deadline = time.monotonic() + 30  # generous: a loaded machine is slow
            while time.monotonic() < deadline:
                if resolver.store_errors >= errors:
                    break
                await asyncio.sleep(0.01)
            logged.append(len([r for r in caplog.records if r.name == "kvmigrate.identity"]))
        assert logged == [1, 1]
        failed = resolver.store_errors
        rename("rollout_links_away", "rollout_links")
        reader = ContinuityResolver(store, 60.0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            later = await reader.identify({}, chat(LATER), MODEL, "chat/completions")
            if later.source == "continuity":
                break
            reader = ContinuityResolver(store, 60.0)  # nothing kept from a miss
            await asyncio.sleep(0.01)
        await resolver.done()
        return failed, later.source == "continuity"

    with caplog.at_level(logging.ERROR, "kvmigrate.identity"):
        try:
            failed, written = asyncio.run(go())
        finally:
            store.close()
    assert failed >= 2
    assert written
    assert [r.getMessage() for r in caplog.records if r.name == "kvmigrate.identity"] == [
        "cannot save conversation links, retrying: "
        f"rollout store {path}: no such table: rollout_links"
    ]
