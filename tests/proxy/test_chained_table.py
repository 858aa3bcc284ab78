"""`proxy/chained.py`, the glue between a Responses request and the response-id map, row by
row: where a continued chain goes (its stored backend, whatever the split says), what an
exchange carries for the map, which id a shadow copy continues or what context re-seeds it,
and which backend answers `GET /v1/responses/{id}`. The map is a real `ChainMap` over a
resolver without a store (one proxy); the end-to-end paths are in tests/continuity/."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection

import orjson
import pytest

from kvmigrate.continuity.chains import ChainMap, ChainTurn
from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.policies import Route
from kvmigrate.policies.chain import CONVERSATION_PREFIX, RESPONSE_PREFIX, ChainEntry, ChainRef
from kvmigrate.policies.decision import RolloutSnapshot
from kvmigrate.proxy.body import parse_body
from kvmigrate.proxy.chain_context import ChainContext, ContextUnavailable
from kvmigrate.proxy.chained import ChainRouting
from kvmigrate.proxy.errors import ProxyError
from kvmigrate.proxy.metrics import ProxyMetrics
from kvmigrate.rollout.state import RolloutState
from kvmigrate.rollout.store import open_store

SNAPSHOT = RolloutSnapshot("hosted", "vllm", "split", 50.0, 1.0, "salt")
BOTH = ("hosted", "vllm")
BODY = b'{"model":"gpt-4o-mini","input":"next","previous_response_id":"resp_1"}'


def routing() -> ChainRouting:
    return ChainRouting(ChainMap(ContinuityResolver()), ProxyMetrics())


class SplitSays:
    """A `route_for` whose split picked `serve`; it records what it was asked."""

    def __init__(self, serve: str, shadow: str | None = None) -> None:
        self.serve, self.shadow = serve, shadow
        self.asked: list[tuple[str, int, tuple[str, ...]]] = []

    async def __call__(self, conversation: str, turn: int, served: Collection[str]) -> Route:
        self.asked.append((conversation, turn, tuple(served)))
        return Route(SNAPSHOT, serve=self.serve, shadow=self.shadow, fallback="hosted", pin=True)


def dropped(chained: ChainRouting) -> float:
    value = chained.metrics.registry.get_sample_value(
        "kvmigrate_shadow_dropped_total", {"reason": "no_candidate_chain"}
    )
    return value or 0.0


def reseeded(chained: ChainRouting) -> float:
    return chained.metrics.registry.get_sample_value("kvmigrate_shadow_reseeded_total") or 0.0


# --- route ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored_on", "split", "serve", "shadow", "fallback", "pin"),
    [
        # the chain's backend serves, with no fallback (nobody else holds the chain)
        ("hosted", "hosted", "hosted", "vllm", None, False),  # on the primary: keeps its copy
        ("vllm", "vllm", "vllm", "vllm", None, False),
        ("vllm", "hosted", "vllm", None, None, False),  # moved off the split's choice: no copy
        ("hosted", "vllm", "hosted", None, None, False),
    ],
)
def test_a_stored_chain_is_served_where_it_is_stored(
    stored_on: str, split: str, serve: str, shadow: str | None, fallback: str | None, pin: bool
) -> None:
    async def go() -> None:
        chained = routing()
        chained.chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("conv-a", 3, stored_on))
        route_for = SplitSays(split, shadow="vllm")
        ref = ChainRef("resp_1", None)
        identity, route = await chained.route(ref, parse_body(BODY), BOTH, route_for)
        assert (identity.conversation, identity.turn, identity.source) == ("conv-a", 4, "chain")
        assert route_for.asked == [("conv-a", 4, BOTH)]
        assert (route.serve, route.shadow, route.fallback, route.pin) == (
            serve,
            shadow,
            fallback,
            pin,
        )

    asyncio.run(go())


@pytest.mark.parametrize(
    ("served", "serve"),
    [
        (BOTH, "hosted"),  # an id nobody remembers: the primary, where hosted agents started
        (("vllm",), "vllm"),  # ... unless only the candidate serves the model
    ],
)
def test_an_unknown_chain_goes_to_the_primary_when_it_serves_the_model(
    served: tuple[str, ...], serve: str
) -> None:
    async def go() -> None:
        chained = routing()
        route_for = SplitSays("vllm")
        identity, route = await chained.route(
            ChainRef("resp_gone", None), parse_body(BODY), served, route_for
        )
        assert (identity.turn, identity.source) == (2, "guess")
        assert identity.conversation == "resp:resp_gone"
        assert (route.serve, route.fallback) == (serve, None)
        assert chained.chains.misses == 1

    asyncio.run(go())


def test_a_chain_stored_on_a_backend_that_does_not_serve_the_model_is_a_400() -> None:
    async def go() -> None:
        chained = routing()
        chained.chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("conv-a", 1, "vllm"))
        body = parse_body(b'{"model":"other-model","previous_response_id":"resp_1"}')
        with pytest.raises(ProxyError) as raised:
            await chained.route(ChainRef("resp_1", None), body, ("hosted",), SplitSays("hosted"))
        error = raised.value
        assert (error.status, error.code, error.param) == (
            400,
            "previous_response_not_served",
            "previous_response_id",
        )
        assert error.message == (
            "The response this request continues is stored on backend `vllm`, which does not "
            "serve the model `other-model`: continue it with the model that started it."
        )

    asyncio.run(go())


def test_a_conversations_api_id_seen_first_is_its_first_turn_on_the_primary() -> None:
    """A new Conversations API id: its first turn, on no known backend (the primary)."""

    async def go() -> None:
        chained = routing()
        identity, route = await chained.route(
            ChainRef(None, "conv_9"), parse_body(BODY), BOTH, SplitSays("vllm"), "declared"
        )
        assert (identity.conversation, identity.turn) == ("conv:conv_9", 1)
        assert route.serve == "hosted"

    asyncio.run(go())


def test_the_declared_conversation_recovers_one_the_store_keeps_hashed(sqlite_url: str) -> None:
    """Another proxy stored the chain: the store names its conversation only hashed, and the
    conversation the request declares again is the one it continues."""
    store = open_store(sqlite_url, RolloutState())

    async def go() -> list[str]:
        first = ChainMap(ContinuityResolver(store, 60.0))
        first.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("dave@example.com", 1, "vllm"))
        await first.links.done()
        found = []
        for declared in ("dave@example.com", None):
            chained = ChainRouting(ChainMap(ContinuityResolver(store, 60.0)), ProxyMetrics())
            identity, route = await chained.route(
                ChainRef("resp_1", None), parse_body(BODY), BOTH, SplitSays("hosted"), declared
            )
            assert (identity.turn, route.serve) == (2, "vllm")
            found.append(identity.conversation)
        return found

    try:
        assert asyncio.run(go()) == ["dave@example.com", store.keys.key("dave@example.com")]
    finally:
        store.close()


# --- turn -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "stores"),
    [
        ("", True),  # the API's default is to store
        (',"store":true', True),
        (',"store":null', True),
        (',"store":0', True),  # only false says no
        (',"store":false', False),
    ],
)
def test_an_exchange_stores_unless_the_request_says_store_false(extra: str, stores: bool) -> None:
    body = parse_body(b'{"model":"m","input":"x"' + extra.encode() + b"}")
    assert ChainRouting.turn("c", 2, body, None) == ChainTurn("c", 2, stores=stores)


@pytest.mark.parametrize(
    ("ref", "conversation_id"),
    [
        (None, None),
        (ChainRef("resp_1", None), None),
        (ChainRef(None, "conv_7"), "conv_7"),
        (ChainRef("resp_1", "conv_7"), "conv_7"),
    ],
)
def test_an_exchange_carries_the_conversations_api_id_it_named(
    ref: ChainRef | None, conversation_id: str | None
) -> None:
    body = parse_body(b'{"model":"m","input":"x"}')
    turn = ChainRouting.turn("c", 5, body, ref)
    assert (turn.conversation, turn.turn, turn.conversation_id) == ("c", 5, conversation_id)
    assert (turn.copy_of, turn.response_id) == (None, None)


# --- expect_shadow_id -------------------------------------------------------------------------


@pytest.mark.parametrize("owner", ["", "vllm-b"])
def test_a_copy_about_to_go_out_makes_its_candidate_id_awaited(owner: str) -> None:
    async def go() -> None:
        chained = routing()
        turn = ChainTurn("c", 1, True, response_id="resp_p")
        assert chained.expect_shadow_id(turn, owner) == "resp_p"
        waiting = asyncio.ensure_future(chained.chains.shadow_id_of("resp_p", owner))
        await asyncio.sleep(0)
        assert not waiting.done()  # it waits for the copy, for this owner only
        other = "" if owner else "vllm-b"
        assert await chained.chains.shadow_id_of("resp_p", other) is None
        chained.chains.record_shadow_id("resp_p", "resp_c", owner)
        assert await waiting == "resp_c"

    asyncio.run(go())


@pytest.mark.parametrize("chain", [None, "resp_p", ChainTurn("c", 1, True)])
def test_nothing_is_awaited_without_a_primary_id(chain: object) -> None:
    async def go() -> None:
        chained = routing()
        assert chained.expect_shadow_id(chain) is None
        assert await chained.chains.shadow_id_of("resp_p") is None

    asyncio.run(go())


# --- copy_body --------------------------------------------------------------------------------


class Context(ChainContext):
    """The stored turn's context as the backend that stores it would give it, or its failure
    (the reads themselves are tested against real servers in tests/continuity/)."""

    def __init__(self, failure: str | None = None) -> None:
        self.failure = failure
        self.asked: list[tuple[bytes, str]] = []

    async def stateless_body(self, body: bytes, previous: str) -> bytes:
        self.asked.append((body, previous))
        if self.failure is not None:
            raise ContextUnavailable(self.failure)
        return b'{"model":"gpt-4o-mini","input":[]}'


@pytest.mark.parametrize("owner", ["", "vllm-b"])
def test_a_copy_continues_the_candidates_own_id_spliced_in(owner: str) -> None:
    async def go() -> None:
        chained = routing()
        chained.chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("c", 1, "hosted"))
        chained.chains.record_shadow_id("resp_1", "resp_own", owner)
        context = Context()
        copy = await chained.copy_body(BODY, ChainRef("resp_1", None), owner, context)
        assert copy is not None
        assert orjson.loads(copy) == {**orjson.loads(BODY), "previous_response_id": "resp_own"}
        assert context.asked == []
        assert (dropped(chained), reseeded(chained)) == (0.0, 0.0)
        other = "" if owner else "vllm-b"  # another candidate's chain has no such turn
        assert await chained.copy_body(BODY, ChainRef("resp_1", None), other) is None

    asyncio.run(go())


def test_a_copy_without_the_candidates_turn_is_reseeded_from_the_stored_context() -> None:
    async def go() -> None:
        chained = routing()
        context = Context()
        copy = await chained.copy_body(BODY, ChainRef("resp_1", None), "", context)
        assert copy == b'{"model":"gpt-4o-mini","input":[]}'
        assert context.asked == [(BODY, "resp_1")]
        assert (dropped(chained), reseeded(chained)) == (0.0, 1.0)

    asyncio.run(go())


def test_a_context_that_cannot_be_read_drops_the_copy_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def go() -> None:
        chained = routing()
        context = Context("a hosted tool's call")
        assert await chained.copy_body(BODY, ChainRef("resp_1", None), "", context) is None
        (warning,) = caplog.records  # the first one is logged
        assert warning.getMessage() == (
            "a shadow copy could not re-seed the candidate's chain (a hosted tool's call): "
            'skipped; kvmigrate_shadow_dropped_total{reason="no_candidate_chain"} counts these'
        )
        for _ in range(2):
            assert await chained.copy_body(BODY, ChainRef("resp_1", None), "", context) is None
        assert len(caplog.records) == 1  # and no other
        assert (dropped(chained), reseeded(chained)) == (3.0, 0.0)

    with caplog.at_level(logging.WARNING, "kvmigrate.proxy.shadow"):
        asyncio.run(go())


def test_the_models_only_candidate_is_the_default_owner() -> None:
    async def go() -> None:
        chained = routing()
        chained.chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("c", 1, "hosted"))
        assert chained.expect_shadow_id(ChainTurn("c", 1, True, response_id="resp_1")) == "resp_1"
        waiting = asyncio.ensure_future(chained.chains.shadow_id_of("resp_1", ""))
        await asyncio.sleep(0)
        assert not waiting.done()  # the copy to the only candidate is awaited
        chained.chains.record_shadow_id("resp_1", "resp_own", "")
        assert await waiting == "resp_own"
        copy = await chained.copy_body(BODY, ChainRef("resp_1", None))
        assert copy is not None
        assert orjson.loads(copy)["previous_response_id"] == "resp_own"

    asyncio.run(go())


@pytest.mark.parametrize(
    ("ref", "with_context"),
    [
        (ChainRef(None, "conv_1"), True),  # a Conversations API chain: nothing to re-seed from
        (ChainRef("resp_1", None), False),  # no way to read the context
    ],
)
def test_a_copy_with_nothing_to_continue_or_reseed_is_dropped(
    ref: ChainRef, with_context: bool
) -> None:
    async def go() -> None:
        chained = routing()
        context = Context()
        copy = await chained.copy_body(BODY, ref, "", context if with_context else None)
        assert copy is None
        assert context.asked == []
        assert (dropped(chained), reseeded(chained)) == (1.0, 0.0)

    asyncio.run(go())


# --- stored_on --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "backends", "answer"),
    [
        ("responses/resp_1", BOTH, "vllm"),
        ("responses/resp_1/input_items", BOTH, "vllm"),
        ("responses/resp_1", ("hosted",), None),  # the model's backends no longer hold it
        ("responses/resp_2", BOTH, None),  # unknown: the primary answers
        ("responses/", BOTH, None),  # no id to look up (the map holds none empty)
        ("responses", BOTH, None),
        ("responsesX/resp_1", BOTH, None),
        ("conversations/conv_1", BOTH, None),  # not a response, though the map knows it
        ("chat/completions/resp_1", BOTH, None),
    ],
)
def test_a_stored_response_is_read_from_the_backend_that_stored_it(
    suffix: str, backends: tuple[str, ...], answer: str | None
) -> None:
    async def go() -> None:
        chained = routing()
        chained.chains.keep(RESPONSE_PREFIX + "resp_1", ChainEntry("c", 1, "vllm"))
        chained.chains.keep(CONVERSATION_PREFIX + "conv_1", ChainEntry("c", 1, "vllm"))
        assert await chained.stored_on(suffix, backends) == answer

    asyncio.run(go())
