"""LiteLLM's Responses ids back to the upstream's, the deployment they name, and where a
continued chain goes in the plugin: tables, without LiteLLM."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace

import pytest

from kvmigrate.continuity.resolver import ContinuityResolver
from kvmigrate.litellm_bridge.chains import PluginChains
from kvmigrate.litellm_bridge.ids import (
    ManagedId,
    ResponseIds,
    advertised_id,
    decode_managed,
    encode_managed,
)
from kvmigrate.policies import Route, route
from kvmigrate.policies.chain import RESPONSE_PREFIX, ChainEntry
from kvmigrate.policies.decision import RolloutSnapshot


def _b64(text: str) -> str:
    return "resp_" + base64.b64encode(text.encode()).decode()


# As LiteLLM 1.108.7 writes them (ResponsesAPIRequestUtils._build_responses_api_response_id).
LITELLM_ID = _b64("litellm:custom_llm_provider:openai;model_id:dep-1;response_id:resp_abc")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (LITELLM_ID, ManagedId("resp_abc", "dep-1", "openai")),
        # Padding a client (or a copy-paste) dropped: still decoded.
        (LITELLM_ID.rstrip("="), ManagedId("resp_abc", "dep-1", "openai")),
        (_b64("litellm:custom_llm_provider:;model_id:;response_id:r1"), ManagedId("r1")),
        ("resp_abc123", ManagedId("resp_abc123")),  # the upstream's own id
        ("msg_1", ManagedId("msg_1")),
        (_b64("litellm:custom_llm_provider:openai;model_id:dep-1"), None),  # 2 parts
        (_b64("other:custom_llm_provider:x;model_id:m;response_id:r"), None),
        (_b64("litellm:custom_llm_provider:x;model:m;response_id:r"), None),
        (_b64("litellm:custom_llm_provider:x;model_id:m;response_id:"), None),  # empty id
        ("resp_" + base64.b64encode(b"\xff\xfe;;").decode(), None),  # not UTF-8
        ("resp_!!!not-base64", None),
        ("resp_", None),
    ],
)
def test_decode_managed(given: str, expected: ManagedId | None) -> None:
    assert decode_managed(given) == (expected or ManagedId(given))


def test_encode_managed_is_what_decode_reads() -> None:
    assert encode_managed("resp_x", "dep-9", "anthropic") == _b64(
        "litellm:custom_llm_provider:anthropic;model_id:dep-9;response_id:resp_x"
    )


def _unwrap(value: str) -> str:
    """A stand-in for LiteLLM's decryption: `resp_enc-<inner>` -> inner."""
    if value == "resp_enc-broken":
        raise ValueError("bad ciphertext")
    return value.removeprefix("resp_enc-") if value.startswith("resp_enc-") else value


@pytest.mark.parametrize(
    ("given", "key", "deployment"),
    [
        ("resp_enc-" + LITELLM_ID, "resp_abc", "dep-1"),  # both layers
        (LITELLM_ID, "resp_abc", "dep-1"),  # as LiteLLM's log sees it
        ("resp_abc", "resp_abc", None),
        ("resp_enc-broken", "resp_enc-broken", None),  # LiteLLM's helper failed
        ("chatcmpl-1", "chatcmpl-1", None),  # not a Responses id: not unwrapped
    ],
)
def test_response_ids_remove_both_layers(given: str, key: str, deployment: str | None) -> None:
    ids = ResponseIds(_unwrap)
    assert ids.key(given) == key
    assert ids.managed(given).model_id == deployment


def test_without_litellm_only_layer_one_is_removed() -> None:
    assert ResponseIds(None).key("resp_enc-" + LITELLM_ID) == "resp_enc-" + LITELLM_ID
    assert ResponseIds(None).key(LITELLM_ID) == "resp_abc"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (SimpleNamespace(id=LITELLM_ID), LITELLM_ID),  # a whole ResponsesAPIResponse
        (SimpleNamespace(id="evt_1", response=SimpleNamespace(id="resp_z")), "resp_z"),
        (SimpleNamespace(type="response.created", response={"id": "resp_y"}), "resp_y"),
        (SimpleNamespace(type="response.output_text.delta", delta="hi"), None),
        (SimpleNamespace(id="chatcmpl-1"), None),  # a chat chunk
        ({"id": "resp_dict"}, None),  # LiteLLM hands objects, not dicts
        (SimpleNamespace(response={"id": ""}), None),
    ],
)
def test_advertised_id(answer: object, expected: str | None) -> None:
    assert advertised_id(answer) == expected


# -- where a continued chain goes -------------------------------------------------------------

SERVED = {"hosted": "gpt-4o-mini", "vllm": "vllm-llama"}
GROUPS = {"dep-hosted": "gpt-4o-mini", "dep-vllm": "vllm-llama", "dep-other": "other"}


def _chains() -> PluginChains:
    return PluginChains(ContinuityResolver(), ResponseIds(_unwrap), GROUPS.get)


async def _route(chains: PluginChains, previous: str, percent: float) -> tuple[str, Route]:
    snapshot = RolloutSnapshot("hosted", "vllm", "split", percent, 1.0, "salt")
    chained = chains.chained({"previous_response_id": previous})
    assert chained is not None

    async def route_for(conversation: str, turn: int) -> Route:
        return route(conversation, snapshot, SERVED)

    identity, chosen = await chains.route(chained, SERVED, route_for)
    return f"{identity.conversation}/{identity.turn}/{identity.source}", chosen


@pytest.mark.parametrize(
    ("stored_on", "percent", "serve", "shadow"),
    [
        # Remembered: where it is stored, whatever the split says; no fallback.
        ("vllm", 0, "vllm", None),
        ("hosted", 100, "hosted", None),
        # On the primary at a split that keeps it there: its copy continues the candidate's.
        ("hosted", 0, "hosted", "vllm"),
    ],
)
def test_a_remembered_chain_goes_where_it_is_stored(
    stored_on: str, percent: float, serve: str, shadow: str | None
) -> None:
    chains = _chains()
    chains.map.keep(RESPONSE_PREFIX + "resp_abc", ChainEntry("conv-1", 3, stored_on))
    client_id = "resp_enc-" + encode_managed("resp_abc", "dep-elsewhere")
    identity, chosen = asyncio.run(_route(chains, client_id, percent))
    assert identity == "conv-1/4/chain"
    assert (chosen.serve, chosen.shadow, chosen.fallback) == (serve, shadow, None)
    assert chains.by_deployment == 0


@pytest.mark.parametrize(
    ("deployment", "percent", "serve", "by_deployment"),
    [
        ("dep-vllm", 0, "vllm", 1),  # forgotten by the map: the id's deployment's group
        ("dep-hosted", 100, "hosted", 1),
        ("dep-other", 100, "hosted", 0),  # a group of no backend: the primary
        ("dep-unknown", 100, "hosted", 0),
    ],
)
def test_a_forgotten_chain_goes_to_the_group_of_the_deployment_its_id_names(
    deployment: str, percent: float, serve: str, by_deployment: int
) -> None:
    chains = _chains()
    client_id = encode_managed("resp_lost", deployment)
    identity, chosen = asyncio.run(_route(chains, client_id, percent))
    assert identity == "resp:resp_lost/2/guess"
    assert (chosen.serve, chosen.fallback) == (serve, None)
    assert chains.by_deployment == by_deployment
