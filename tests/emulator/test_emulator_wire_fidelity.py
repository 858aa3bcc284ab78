"""Wire fidelity the probe found missing: Anthropic's own wording for a body that is not JSON
and for a path it does not serve, error envelopes for a method a route does not take, and the
Responses API's reading of `previous_response_id` and of `reasoning` input items."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest
from emulator_support import HOSTED_MODEL, StartEmulator, client, raw

from kvmigrate.serving import BackgroundServer

CLAUDE = "claude-sonnet-4-5"
HEADERS = {"anthropic-version": "2023-06-01"}


@pytest.fixture
def anthropic_server(start_emulator: StartEmulator) -> BackgroundServer:
    return start_emulator("anthropic")


@pytest.fixture
def openai_client(hosted_server: BackgroundServer) -> Iterator[openai.OpenAI]:
    sdk = client(hosted_server)
    yield sdk
    sdk.close()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"model": ', "unexpected end of data"),
        # Anthropic's parser refuses an escaped lone surrogate, as Claude Code users see it
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "no low surrogate"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_body_that_is_not_json_is_refused_in_anthropics_words(
    anthropic_server: BackgroundServer, route: str, body: bytes, reason: str
) -> None:
    status, _, answer = raw(anthropic_server, "POST", route, body, HEADERS)
    assert status == 400
    error = json.loads(answer)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"The request body is not valid JSON: {reason}")
    assert "OpenAI" not in error["message"]


def test_anthropic_unknown_path_is_not_found_in_anthropics_words(
    anthropic_server: BackgroundServer,
) -> None:
    sdk = anthropic.Anthropic(base_url=anthropic_server.url, api_key="k", max_retries=0)
    with sdk, pytest.raises(anthropic.NotFoundError) as caught:
        sdk.post("/v1/messagez", body={}, cast_to=object)
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["error"] == {"type": "not_found_error", "message": "Not Found"}


@pytest.mark.parametrize("profile", ["hosted", "anthropic", "vllm"])
def test_a_method_a_route_does_not_take_is_answered_in_the_profiles_envelope(
    start_emulator: StartEmulator, profile: str
) -> None:
    server = start_emulator(profile)
    status, headers, answer = raw(server, "GET", "/v1/messages", None, HEADERS)
    assert status == 405
    assert headers["Content-Type"].startswith("application/json")
    body = json.loads(answer)
    if profile == "hosted":
        assert body["error"]["message"] == "Invalid method for URL (GET /v1/messages)"
    elif profile == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:  # vLLM is a FastAPI app
        assert body == {"detail": "Method Not Allowed"}


@pytest.mark.parametrize("previous", [123, {"id": "resp_1"}, ["resp_1"], True])
def test_previous_response_id_of_another_type_is_refused_not_ignored(
    openai_client: openai.OpenAI, previous: object
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client.responses.create(
            model=HOSTED_MODEL, input="hi", extra_body={"previous_response_id": previous}
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"
    assert error["code"] == "invalid_type"


def test_stateless_chain_resending_reasoning_items_is_answered(
    openai_client: openai.OpenAI,
) -> None:
    # A reasoning model's agent with `store: false` sends its reasoning items back each turn
    # (`include: ["reasoning.encrypted_content"]`), as the hosted API asks it to.
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}
    answer = openai_client.responses.create(
        model=HOSTED_MODEL,
        store=False,
        include=["reasoning.encrypted_content"],
        input=[
            {"role": "user", "content": "Name a river."},
            reasoning,  # type: ignore[list-item]
            {"role": "assistant", "content": "The Danube."},
            {"role": "user", "content": "Another one?"},
        ],
    )
    assert answer.status == "completed"
    assert answer.output_text
