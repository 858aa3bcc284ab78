"""`GET /v1/responses/{id}/input_items`: the items a stored response was answered from (the
chain's earlier inputs and outputs, then its own input), in OpenAI's list shape, newest
first by default, paged by `limit` and `after`. Read with the official openai SDK."""

from __future__ import annotations

import json

import openai
import pytest
from emulator_support import client, model_of, raw

from kvmigrate.serving import BackgroundServer


def _chain(server: BackgroundServer, sdk: openai.OpenAI) -> tuple[list[str], list[str]]:
    """Three turns (the second with item input); their ids and answers."""
    model = model_of(server)
    first = sdk.responses.create(model=model, instructions="Be brief.", input="Plan a day.")
    second = sdk.responses.create(
        model=model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "And lunch?"}]}],
        previous_response_id=first.id,
    )
    third = sdk.responses.create(model=model, input="And dinner?", previous_response_id=second.id)
    return [first.id, second.id, third.id], [
        first.output_text,
        second.output_text,
        third.output_text,
    ]


def _text(item: object) -> tuple[str, str, str]:
    data = item.model_dump() if hasattr(item, "model_dump") else item
    assert isinstance(data, dict)
    parts = data["content"]
    return data["role"], parts[0]["type"], "".join(p["text"] for p in parts)


def test_the_items_of_a_continued_response_are_its_whole_history(
    any_server: BackgroundServer,
) -> None:
    sdk = client(any_server)
    ids, answers = _chain(any_server, sdk)
    items = list(sdk.responses.input_items.list(ids[2], order="asc"))
    assert [_text(i) for i in items] == [
        ("user", "input_text", "Plan a day."),  # instructions are no item
        ("assistant", "output_text", answers[0]),
        ("user", "input_text", "And lunch?"),
        ("assistant", "output_text", answers[1]),
        ("user", "input_text", "And dinner?"),
    ]
    assert len({i.id for i in items}) == 5
    # The default order is newest first.
    assert [i.id for i in sdk.responses.input_items.list(ids[2])] == [i.id for i in items][::-1]
    first = list(sdk.responses.input_items.list(ids[0], order="asc"))
    assert [_text(i) for i in first] == [("user", "input_text", "Plan a day.")]
    sdk.close()


def test_pages_follow_limit_and_after_in_the_apis_list_shape(any_server: BackgroundServer) -> None:
    sdk = client(any_server)
    ids, _ = _chain(any_server, sdk)
    path = f"/v1/responses/{ids[2]}/input_items?order=asc&limit=2"
    status, _, body = raw(any_server, "GET", path)
    page = json.loads(body)
    assert status == 200
    assert set(page) == {"object", "data", "first_id", "last_id", "has_more"}
    assert (page["object"], len(page["data"]), page["has_more"]) == ("list", 2, True)
    assert (page["first_id"], page["last_id"]) == (page["data"][0]["id"], page["data"][1]["id"])
    seen = [item["id"] for item in page["data"]]
    while page["has_more"]:
        status, _, body = raw(any_server, "GET", f"{path}&after={page['last_id']}")
        page = json.loads(body)
        seen += [item["id"] for item in page["data"]]
    assert seen == [i.id for i in sdk.responses.input_items.list(ids[2], order="asc")]
    # The SDK's own paging gets every item too.
    assert len(list(sdk.responses.input_items.list(ids[2], limit=1))) == 5
    sdk.close()


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("order=sideways", "order"),
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("after=x", "after"),
    ],
)
def test_a_bad_query_is_refused_as_the_api_refuses_it(
    hosted_server: BackgroundServer, query: str, param: str
) -> None:
    sdk = client(hosted_server)
    first = sdk.responses.create(model=model_of(hosted_server), input="Hi.")
    sdk.close()
    status, _, body = raw(hosted_server, "GET", f"/v1/responses/{first.id}/input_items?{query}")
    assert status == 400
    assert json.loads(body)["error"]["param"] == param


def test_an_unknown_response_has_no_items(hosted_server: BackgroundServer) -> None:
    status, _, _ = raw(hosted_server, "GET", "/v1/responses/resp_unknown/input_items")
    assert status == 404
