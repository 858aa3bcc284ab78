"""Drop-in details of model names (issue 17): `GET /v1/models/{alias}` answers for a
configured alias; every answer says in a header which model served it; and with
`server.answer_model: requested` the candidate's answers name the model the client asked for,
streamed and not, on chat and Responses alike. Real proxy, real emulators, the openai SDK."""

from __future__ import annotations

import openai
import pytest
from proxy_support import HOSTED_MODEL, VLLM_MODEL, ProxyFactory

ON_CANDIDATE = "{mode: split, percent: 100, pinning: false}"


def test_a_configured_alias_can_be_retrieved(make_proxy: ProxyFactory) -> None:
    client = make_proxy().client()
    card = client.models.retrieve(HOSTED_MODEL)
    assert (card.id, card.object) == (HOSTED_MODEL, "model")
    with pytest.raises(openai.NotFoundError):  # not an alias: the primary's answer
        client.models.retrieve("gpt-unknown")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("setting", ["served", "requested"])
def test_the_answer_names_the_served_or_the_requested_model(
    make_proxy: ProxyFactory, stream: bool, setting: str
) -> None:
    proxy = make_proxy(ON_CANDIDATE, extra=f"server: {{answer_model: {setting}}}")
    client = proxy.client()
    expected = HOSTED_MODEL if setting == "requested" else VLLM_MODEL
    messages = [{"role": "user", "content": "Tell me about glaciers"}]
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=HOSTED_MODEL, messages=messages, stream=True
        ) as raw:
            served = raw.headers["x-kvmigrate-served-model"]
            models = {chunk.model for chunk in raw.parse()}
        with client.responses.stream(model=HOSTED_MODEL, input="Tell me about glaciers") as events:
            answer_model = events.get_final_response().model
    else:
        raw_chat = client.chat.completions.with_raw_response.create(
            model=HOSTED_MODEL, messages=messages
        )
        served = raw_chat.headers["x-kvmigrate-served-model"]
        models = {raw_chat.parse().model}
        answer_model = client.responses.create(model=HOSTED_MODEL, input="Tell me").model
    assert served == VLLM_MODEL
    assert models == {expected}
    assert answer_model == expected


def test_the_primary_answer_names_its_served_model_in_the_header(
    make_proxy: ProxyFactory,
) -> None:
    raw = (
        make_proxy()
        .client()
        .chat.completions.with_raw_response.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    )
    assert raw.headers["x-kvmigrate-served-model"] == HOSTED_MODEL
