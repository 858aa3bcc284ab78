"""A dropped shadow copy costs a chain one turn, not the rest of it: the copy of the next
turn goes to the candidate with the chain's context read back from the primary (re-seeded),
and the copy after continues the candidate's own chain from there.

Real proxy, real emulators that record what reaches them (each has its own response store
and answers 404 for an id it never issued), the official openai SDK. The proxy runs in the
pass-through mode (no master key, no key on the primary): the reads of the context carry
the client's key to the primary, as its own call does, and the candidate never sees it.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from settling import wait_settled

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
CLIENT_KEY = "sk-client-key-0123456789"
VLLM_KEY = "sk-vllm-own-key"
Handler = Callable[[web.Request], Any]
# What a reasoning model's agent sends back: opaque to any other model.
REASONING = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"}


@dataclass(frozen=True)
class Seen:
    method: str
    path_qs: str
    authorization: str
    body: dict[str, Any]
    status: int
    answer_id: str  # the id of the response it answered, if whole


@dataclass
class Recording:
    """An emulator that records each call that reaches it; `refuse_reads`: it answers
    every GET 404, as for a response it no longer stores."""

    profile: str
    api_key: str
    seen: list[Seen] = field(default_factory=list)
    refuse_reads: bool = False

    def app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
            raw = await request.read()
            response: web.StreamResponse
            if self.refuse_reads and request.method == "GET":
                response = web.json_response({"error": {"message": "gone"}}, status=404)
            else:
                response = await handler(request)
            body = orjson.loads(raw) if raw else {}
            whole = response.body if isinstance(response, web.Response) else None
            answer_id = ""
            if isinstance(whole, bytes) and response.status == 200:
                answer_id = str(orjson.loads(whole).get("id", ""))
            auth = request.headers.get("Authorization", "")
            seen = Seen(request.method, request.path_qs, auth, body, response.status, answer_id)
            self.seen.append(seen)
            return response

        settings = EmulatorSettings(self.profile, time_scale=0.01, api_key=self.api_key)
        app = build_app(settings)
        app.middlewares.insert(0, record)
        return app

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST" and s.path_qs == "/v1/responses"]


@dataclass
class Bed:
    hosted: Recording
    vllm: Recording
    proxy: BackgroundServer
    hosted_url: str

    def primary_items(self, response_id: str) -> list[dict[str, Any]]:
        """The primary's input items of a response it stores, asked of it directly."""
        request = urllib.request.Request(
            f"{self.hosted_url}/v1/responses/{response_id}/input_items?order=asc&limit=100",
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            items: list[dict[str, Any]] = orjson.loads(response.read())["data"]
        return items

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.proxy.url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30
        )


@pytest.fixture
def bed(tmp_path: Path) -> Iterator[Bed]:
    hosted, vllm = Recording("hosted", CLIENT_KEY), Recording("vllm", VLLM_KEY)
    with BackgroundServer(hosted.app) as hosted_server, BackgroundServer(vllm.app) as vllm_server:
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{hosted_server.url}/v1"}}
  vllm: {{api_base: "{vllm_server.url}/v1", api_key: {VLLM_KEY},
          candidate_headers: [x-emulator-fault]}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: {SERVED}}}
rollout: {{mode: shadow, state: "sqlite:///{tmp_path}/state.db"}}
record: {{db: "sqlite:///{tmp_path}/records.db"}}
""",
            env={},
        )
        with BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)) as proxy:
            yield Bed(hosted, vllm, proxy, hosted_server.url)


def texts(items: list[Any]) -> list[str]:
    """The text of each message item, whatever its content's form."""
    found = []
    for item in items:
        content = item.get("content")
        if isinstance(content, str):
            found.append(content)
        elif isinstance(content, list):
            found.append("".join(part.get("text", "") for part in content))
    return found


def metric(bed: Bed, name: str, labels: str = "") -> float:
    text = urllib.request.urlopen(bed.proxy.url + "/metrics", timeout=5).read().decode()
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith(name) and labels in line
    )


def test_a_failed_copy_is_followed_by_a_reseeded_one_and_the_chain_is_shadowed_again(
    bed: Bed,
) -> None:
    client = bed.client()
    asked = ["Plan a day in Rome.", "And the evening?", "Where to eat?", "And then?"]
    answers: list[str] = []
    ids: list[str] = []
    previous: str | None = None
    for turn, text in enumerate(asked, start=1):
        # Turn 2's copy fails: the candidate answers 500 (the primary ignores the fault).
        headers = {"x-emulator-fault": "vllm:500"} if turn == 2 else {}
        extra: dict[str, Any] = {"previous_response_id": previous} if previous else {}
        # Turn 2 also sends back a reasoning item, as an agent on a reasoning model does:
        # the primary keeps it among the chain's items; no other model can read it.
        given: Any = [REASONING, {"role": "user", "content": text}] if turn == 2 else text
        answer = client.responses.create(
            model=MODEL, input=given, max_output_tokens=32, extra_headers=headers, **extra
        )
        answers.append(answer.output_text)
        ids.append(answer.id)
        previous = answer.id
        wait_settled(bed.proxy.url, answers=turn)  # each copy ends before the next turn
    client.close()

    copies = bed.vllm.posts()
    assert [(c.status, "previous_response_id" in c.body) for c in copies] == [
        (200, False),  # turn 1: the candidate's chain begins
        (500, True),  # turn 2: continued it, and failed
        (200, False),  # turn 3: re-seeded, in the stateless form
        (200, True),  # turn 4: continues the candidate's chain again
    ]
    # The re-seeded copy holds the history the primary answered turn 3 from, in order.
    assert texts(copies[2].body["input"]) == [
        asked[0],
        answers[0],
        asked[1],
        answers[1],
        asked[2],
    ]
    # The primary's items for turn 3 hold the reasoning; the re-seeded copy does not.
    kept = bed.primary_items(ids[2])
    assert [item["type"] for item in kept].count("reasoning") == 1
    assert "reasoning" not in [item.get("type") for item in copies[2].body["input"]]
    # Turn 4's copy continues the candidate's own answer to that copy.
    assert copies[3].body["previous_response_id"] == copies[2].answer_id
    assert [s.method for s in bed.vllm.seen] == ["POST"] * 4  # asked for nothing else
    assert metric(bed, "kvmigrate_shadow_reseeded_total") == 1
    assert metric(bed, "kvmigrate_shadow_dropped_total", 'reason="no_candidate_chain"') == 0


def test_the_context_is_read_from_the_primary_with_the_clients_key_never_the_candidate(
    bed: Bed,
) -> None:
    client = bed.client()
    first = client.responses.create(model=MODEL, input="Plan a day in Rome.", max_output_tokens=32)
    wait_settled(bed.proxy.url, answers=1)
    second = client.responses.create(
        model=MODEL,
        input="And the evening?",
        previous_response_id=first.id,
        max_output_tokens=32,
        extra_headers={"x-emulator-fault": "vllm:503"},
    )
    wait_settled(bed.proxy.url, answers=2)
    # The client's own query parameters are no part of the proxy's reads of the context.
    client.responses.create(
        model=MODEL,
        input="Where to eat?",
        previous_response_id=second.id,
        max_output_tokens=32,
        extra_query={"order": "desc", "limit": "1"},
    )
    wait_settled(bed.proxy.url, answers=3)
    client.close()

    reads = [s for s in bed.hosted.seen if s.method == "GET"]
    assert [r.path_qs.split("?")[0] for r in reads] == [
        f"/v1/responses/{second.id}/input_items",
        f"/v1/responses/{second.id}",
    ]
    assert {(r.authorization, r.status) for r in reads} == {(f"Bearer {CLIENT_KEY}", 200)}
    assert reads[0].path_qs.endswith("/input_items?order=asc&limit=100")
    assert "?" not in reads[1].path_qs
    assert {s.authorization for s in bed.vllm.seen} == {f"Bearer {VLLM_KEY}"}


def test_a_context_the_primary_cannot_give_skips_the_copy_and_counts_it(bed: Bed) -> None:
    """The primary no longer has the previous turn (expired, deleted): nothing to re-seed
    from, so the copy is skipped as before, counted, and the answer is untouched."""
    client = bed.client()
    first = client.responses.create(model=MODEL, input="Plan a day in Rome.", max_output_tokens=32)
    wait_settled(bed.proxy.url, answers=1)
    second = client.responses.create(
        model=MODEL,
        input="And the evening?",
        previous_response_id=first.id,
        max_output_tokens=32,
        extra_headers={"x-emulator-fault": "vllm:500"},
    )
    wait_settled(bed.proxy.url, answers=2)
    bed.hosted.refuse_reads = True  # as if the primary had dropped the stored turns
    third = client.responses.create(
        model=MODEL, input="Where to eat?", previous_response_id=second.id, max_output_tokens=32
    )
    assert third.output_text
    wait_settled(bed.proxy.url, answers=3)
    client.close()
    assert len(bed.vllm.posts()) == 2  # turn 3's copy: none
    assert metric(bed, "kvmigrate_shadow_reseeded_total") == 0
    assert metric(bed, "kvmigrate_shadow_dropped_total", 'reason="no_candidate_chain"') == 1
