"""`POST /v1/feedback` through a real proxy: who is let in under each auth mode, the exact
error for each bad body, and what lands in the records database (hashed ids, redacted
comment) beside the records it scores."""

from __future__ import annotations

import gzip
import http.client
import json
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from proxy_support import HOSTED_MODEL, proxy_config

from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder.addon import RecorderAddon
from kvmigrate.recorder.store import open_store
from kvmigrate.runtime import build_app as build_app_with_store
from kvmigrate.serving import BackgroundServer

GOOD_KEY = "sk-good-key-0123456789"
MASTER = "sk-master-0123"
SESSION = "alice@example.com/session-1"


class KeyCheckingPrimary:
    """A primary that accepts GOOD_KEY only, as OpenAI's API checks a key."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.emulated = build_app(EmulatorSettings(profile="hosted", time_scale=0))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        if request.headers.get("Authorization") != f"Bearer {GOOD_KEY}":
            return web.json_response(
                {"error": {"message": "Incorrect API key provided (primary's own words).",
                           "type": "invalid_request_error", "param": None,
                           "code": "invalid_api_key"}},
                status=401,
            )  # fmt: skip
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        return web.json_response(
            {"id": "chatcmpl-known-1", "object": "chat.completion", "created": 1,
             "model": HOSTED_MODEL, "choices": [{"index": 0, "finish_reason": "stop",
             "message": {"role": "assistant", "content": "ok"}}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        )  # fmt: skip


class Bed:
    def __init__(self, url: str, db: Path, recorder: RecorderAddon) -> None:
        self.url = url
        self.db = db
        self.recorder = recorder
        self.clients: list[openai.OpenAI] = []

    def client(self, key: str) -> openai.OpenAI:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()

    def rows(self, table: str) -> list[dict[str, Any]]:
        open_store(f"sqlite:///{self.db}").close()  # the schema, where nothing was written
        with sqlite3.connect(self.db) as db:
            db.row_factory = sqlite3.Row
            return [dict(r) for r in db.execute(f"SELECT * FROM {table}")]


class Answer:
    def __init__(self, status_code: int, body: dict[str, Any]) -> None:
        self.status_code = status_code
        self.body = body

    def json(self) -> dict[str, Any]:
        return self.body


def post_feedback(client: openai.OpenAI, body: object) -> Answer:
    """The SDK's own POST to /v1/feedback: its errors are the SDK's exceptions."""
    raw: Any = client.post(
        "/feedback",
        body=body,
        cast_to=object,
        options={"headers": {"X-Stainless-Raw-Response": "true"}},
    )
    parsed: dict[str, Any] = raw.parse()
    return Answer(raw.status_code, parsed)


@pytest.fixture
def primary() -> Iterator[tuple[KeyCheckingPrimary, BackgroundServer]]:
    checker = KeyCheckingPrimary()
    with BackgroundServer(checker.app) as server:
        yield checker, server


@pytest.fixture
def vllm() -> Iterator[BackgroundServer]:
    with BackgroundServer(lambda: build_app(EmulatorSettings(profile="vllm", time_scale=0))) as s:
        yield s


@contextmanager
def _bed(
    tmp_path: Path, hosted: str, vllm: str, extra: str = "", hosted_extra: str = ""
) -> Iterator[Bed]:
    config = proxy_config(hosted, vllm, "{mode: shadow}", extra=extra, hosted_extra=hosted_extra)
    db = tmp_path / "records.db"
    recorder = RecorderAddon(f"sqlite:///{db}", worker="thread")
    server = BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])).start()
    bed = Bed(server.url, db, recorder)
    try:
        yield bed
    finally:
        bed.close()
        server.stop()


@pytest.fixture
def pass_through(
    tmp_path: Path, primary: tuple[KeyCheckingPrimary, BackgroundServer], vllm: BackgroundServer
) -> Iterator[Bed]:
    with _bed(tmp_path, primary[1].url, vllm.url) as bed:
        yield bed


def test_a_score_is_stored_hashed_and_joins_the_answer_it_names(pass_through: Bed) -> None:
    client = pass_through.client(GOOD_KEY)
    answer = client.chat.completions.create(
        model=HOSTED_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Session-ID": SESSION},
    )
    by_answer = post_feedback(
        client, {"response_id": answer.id, "value": 4, "comment": "call me at 555-123-4567"}
    )
    by_conversation = post_feedback(
        client, {"conversation_id": SESSION, "name": "thumbs", "value": 0}
    )
    assert by_answer.status_code == 202
    body = by_answer.json()
    assert body["object"] == "feedback"
    assert body["id"].startswith("fb-")
    assert (body["name"], body["value"]) == ("satisfaction", 4.0)
    assert by_conversation.json()["name"] == "thumbs"
    pass_through.recorder.close()
    record = next(r for r in pass_through.rows("records") if r["role"] == "serve")
    scores = {r["name"]: r for r in pass_through.rows("feedback")}
    # Neither id is stored as sent, and each matches the record's own hash.
    assert record["response_id"].startswith("k:")
    assert scores["satisfaction"]["response_id"] == record["response_id"]
    assert scores["thumbs"]["conversation"] == record["conversation"]
    assert SESSION not in json.dumps(scores)
    assert answer.id not in json.dumps(scores)
    assert scores["satisfaction"]["value"] == 4.0
    assert "555-123-4567" not in scores["satisfaction"]["comment"]
    assert scores["thumbs"]["comment"] is None


def test_an_unknown_id_is_accepted_for_the_report_to_count(pass_through: Bed) -> None:
    """The answer a score names may not be written yet: the score is kept (202), and the
    report counts what it could not join."""
    response = post_feedback(
        pass_through.client(GOOD_KEY), {"response_id": "chatcmpl-never-seen", "value": 1}
    )
    assert response.status_code == 202
    pass_through.recorder.close()
    assert len(pass_through.rows("feedback")) == 1


def _raw_post(
    url: str,
    body: bytes,
    key: str = GOOD_KEY,
    path: str = "/v1/feedback",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        sent = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        connection.request("POST", path, body=body, headers={**sent, **(headers or {})})
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


BAD_BODIES = [
    (b"{", 400, "The request body is not valid JSON: ", None),
    (b"[1, 2]", 400, "The feedback body must be a JSON object.", None),
    (b'{"value": 1}', 400, "Name what the score is for: `conversation_id` (the X-Session-ID "
     "the conversation was sent with, or `user:` and its `user`) or `response_id` (the `id` "
     "of an answer).", "conversation_id"),
    (b'{"response_id": "r"}', 400, "`value` is required: the score, a number.", "value"),
    (b'{"response_id": "r", "value": "5"}', 400, "`value` must be a number.", "value"),
    (b'{"response_id": "r", "value": true}', 400, "`value` must be a number.", "value"),
    (b'{"response_id": "r", "value": NaN}', 400, "`value` must be a finite number.", "value"),
    (b'{"response_id": "r", "value": 1e999}', 400, "`value` must be a finite number.", "value"),
    (b'{"response_id": "r", "value": -Infinity}', 400, "`value` must be a finite number.",
     "value"),
    (b'{"response_id": "r", "value": 1' + b"0" * 400 + b'}', 400,
     "`value` must be a finite number.", "value"),
    (b'{"response_id": "r", "value": 1e300}', 400,
     "`value` must be from -1,000,000 to 1,000,000.", "value"),
    (b'{"response_id": "r", "value": -1000001}', 400,
     "`value` must be from -1,000,000 to 1,000,000.", "value"),
    (b'{"response_id": "r", "value": 1, "comment": "a\\ud800"}', 400,
     "`comment` must be text: it holds a lone surrogate.", "comment"),
    (b'{"response_id": 7, "value": 1}', 400, "`response_id` must be a string.", "response_id"),
    (b'{"conversation_id": "", "value": 1}', 400,
     "`conversation_id` must be 1 to 512 printable characters.", "conversation_id"),
    (b'{"response_id": "r", "value": 1, "name": 3}', 400, "`name` must be a string.", "name"),
    (b'{"response_id": "r", "value": 1, "name": "' + b"n" * 65 + b'"}', 400,
     "`name` must be 1 to 64 printable characters.", "name"),
    (b'{"response_id": "r", "value": 1, "comment": ["x"]}', 400,
     "`comment` must be a string.", "comment"),
    (b'{"response_id": "r", "value": 1, "trace": "t"}', 400,
     "Unrecognized request argument supplied: trace", "trace"),
    (b'{"response_id": "r", "value": 1, "comment": "' + b"x" * 17_000 + b'"}', 413,
     "Request body exceeds the limit of 16384 bytes.", None),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "message", "param"), BAD_BODIES)
def test_each_bad_body_gets_its_error(
    pass_through: Bed, body: bytes, status: int, message: str, param: str | None
) -> None:
    got, envelope = _raw_post(pass_through.url, body)
    assert got == status
    error = envelope["error"]
    assert (
        error["message"].startswith(message)
        if message.endswith(": ")
        else (error["message"] == message)
    )
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    pass_through.recorder.close()
    assert pass_through.rows("feedback") == []


def test_the_sdk_sees_the_error(pass_through: Bed) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        post_feedback(pass_through.client(GOOD_KEY), {"response_id": "r", "value": "high"})
    assert raised.value.status_code == 400
    assert raised.value.body == {
        "message": "`value` must be a number.",
        "type": "invalid_request_error",
        "param": "value",
        "code": None,
    }


def test_pass_through_relays_the_primarys_refusal_and_stores_nothing(
    pass_through: Bed, primary: tuple[KeyCheckingPrimary, BackgroundServer]
) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        post_feedback(pass_through.client("sk-wrong"), {"response_id": "r", "value": 1})
    assert raised.value.status_code == 401
    assert raised.value.message == (
        "Error code: 401 - Incorrect API key provided (primary's own words)."
    )
    # The primary was asked about the key (its model list), and nothing else.
    assert primary[0].paths == ["/v1/models"]
    # A body the key never earned is not read: even a broken one gets the refusal.
    status, envelope = _raw_post(pass_through.url, b"{", key="sk-wrong")
    assert status == 401
    assert envelope["error"]["code"] == "invalid_api_key"
    pass_through.recorder.close()
    assert pass_through.rows("feedback") == []


def test_master_key_mode_checks_the_proxys_key(
    tmp_path: Path, primary: tuple[KeyCheckingPrimary, BackgroundServer], vllm: BackgroundServer
) -> None:
    with _bed(
        tmp_path,
        primary[1].url,
        vllm.url,
        extra=f"server: {{master_key: {MASTER}}}",
        hosted_extra=f", api_key: {GOOD_KEY}",
    ) as bed:
        with pytest.raises(openai.AuthenticationError) as raised:
            post_feedback(bed.client("sk-wrong"), {"response_id": "r", "value": 1})
        assert raised.value.body == {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
        assert post_feedback(bed.client(MASTER), {"response_id": "r", "value": 1}).status_code == (
            202
        )
        # The proxy checks its own key: the primary is never asked.
        assert primary[0].paths == []


def test_open_mode_lets_anyone_in(
    tmp_path: Path, primary: tuple[KeyCheckingPrimary, BackgroundServer], vllm: BackgroundServer
) -> None:
    """Open (the primary has the configured key, no master key): as every route, anyone who
    reaches the proxy; `config check` warns about the mode itself."""
    with _bed(tmp_path, primary[1].url, vllm.url, hosted_extra=f", api_key: {GOOD_KEY}") as bed:
        response = post_feedback(bed.client("anything"), {"conversation_id": "c", "value": 2.5})
        assert response.status_code == 202
        assert primary[0].paths == []


def test_without_a_recorder_feedback_is_refused(
    primary: tuple[KeyCheckingPrimary, BackgroundServer], vllm: BackgroundServer
) -> None:
    config = proxy_config(primary[1].url, vllm.url)
    with BackgroundServer(lambda: build_proxy_app(config)) as server:
        status, envelope = _raw_post(server.url, b'{"response_id": "r", "value": 1}')
    assert status == 404
    assert envelope["error"] == {
        "message": "This proxy records nothing (record.enabled is false), so it keeps no feedback.",
        "type": "invalid_request_error",
        "param": None,
        "code": "feedback_not_recorded",
    }


def test_a_conversation_score_joins_through_the_rollout_stores_key(
    tmp_path: Path, primary: tuple[KeyCheckingPrimary, BackgroundServer], vllm: BackgroundServer
) -> None:
    """`kvmigrate proxy` keys a declared conversation by the rollout store's hash before the
    recorder hashes it: a score by `conversation_id` takes the same two steps."""
    config = proxy_config(
        primary[1].url, vllm.url, f'{{mode: shadow, state: "sqlite:///{tmp_path}/state.db"}}'
    )
    db = tmp_path / "records.db"
    recorder = RecorderAddon(f"sqlite:///{db}", worker="thread")
    app = lambda: build_app_with_store(config, extra_addons=[recorder], record=False)  # noqa: E731
    with BackgroundServer(app) as server:
        bed = Bed(server.url, db, recorder)
        client = bed.client(GOOD_KEY)
        for _ in range(2):  # the first turn may come before the store's keys are read
            client.chat.completions.create(
                model=HOSTED_MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Session-ID": SESSION},
            )
        assert post_feedback(client, {"conversation_id": SESSION, "value": 3}).status_code == 202
        bed.close()
    recorder.close()
    served = {r["conversation"] for r in bed.rows("records") if r["role"] == "serve"}
    (score,) = bed.rows("feedback")
    assert score["conversation"] in served


@pytest.mark.slow
def test_a_locked_database_is_a_503_and_holds_no_other_client(pass_through: Bed) -> None:
    """Scores wait for the database on a thread of their own: while it is locked they get a
    503 after its busy timeout, and a chat whose gzipped body the proxy inflates on the
    loop's shared threads is answered before any of them."""
    client = pass_through.client(GOOD_KEY)
    assert post_feedback(client, {"response_id": "before", "value": 1}).status_code == 202
    chat = json.dumps(
        {"model": HOSTED_MODEL, "messages": [{"role": "user", "content": "x" * 400_000}]}
    ).encode()
    lock = sqlite3.connect(pass_through.db, isolation_level=None, timeout=10)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        with ThreadPoolExecutor(11) as pool:
            scores = [
                pool.submit(_raw_post, pass_through.url, b'{"response_id": "r", "value": 1}')
                for _ in range(10)
            ]
            time.sleep(0.5)  # the scores are waiting for the lock
            status, answer = _raw_post(
                pass_through.url,
                gzip.compress(chat),
                path="/v1/chat/completions",
                headers={"Content-Encoding": "gzip"},
            )
            answered_first = not any(f.done() for f in scores)
            results = [f.result() for f in scores]
    finally:
        lock.rollback()
        lock.close()
    assert status == 200, answer
    assert answered_first
    unavailable = {
        "message": "The records database cannot take feedback now; try again shortly.",
        "type": "server_error",
        "param": None,
        "code": "feedback_unavailable",
    }
    assert {got for got, _ in results} == {503}
    assert all(envelope["error"] == unavailable for _, envelope in results)
    assert post_feedback(client, {"response_id": "after", "value": 2}).status_code == 202
    pass_through.recorder.close()
    assert sorted(row["value"] for row in pass_through.rows("feedback")) == [1.0, 2.0]
