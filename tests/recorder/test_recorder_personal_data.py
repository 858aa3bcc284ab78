"""Conversation ids taken from `user` or `X-Session-ID` are personal data (issue 21 item 4):
with `content: redacted` they reach neither the database nor any report format."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from recorder_support import (
    HOSTED_MODEL,
    Backends,
    recorder_config,
    start_recording_proxy,
    wait_until,
)

from kvmigrate.recorder import open_store
from kvmigrate.report import RENDERERS, build_report

SESSION = "dave@example.com"
USER = "alice-8812"
NAME = "carol.jones@example.org"


def _everything_stored(db: Path) -> str:
    """Every text cell of every table: what a copy of the database would give away."""
    with sqlite3.connect(db) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        cells = [
            str(cell)
            for table in tables
            for row in conn.execute(f"SELECT * FROM {table}")
            for cell in row
        ]
    return "\n".join(cells)


@pytest.mark.parametrize("content", ["redacted", "full"])
def test_conversation_ids_from_people_are_hashed_unless_content_is_full(
    backends: Backends, tmp_path: Path, content: str
) -> None:
    db = tmp_path / "records.db"
    proxy = start_recording_proxy(
        recorder_config(backends.hosted.url, backends.vllm.url, f"sqlite:///{db}", content)
    )
    client = proxy.client()
    messages = [{"role": "user", "name": NAME, "content": "hello there"}]
    for _ in range(2):  # two turns of each: the stored id must stay one conversation
        client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, extra_headers={"X-Session-ID": SESSION}
        )
        client.chat.completions.create(model=HOSTED_MODEL, messages=messages, user=USER)
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 8)
    proxy.stop()

    stored = _everything_stored(db)
    with open_store(f"sqlite:///{db}") as store:
        conversations = {r[0] for r in store.query("SELECT DISTINCT conversation FROM records")}
        report = build_report(store, since=0)
    rendered = "\n".join(render(report) for render in RENDERERS.values())
    assert len(conversations) == 2
    if content == "full":
        assert conversations == {SESSION, "user:" + USER}
        assert NAME in stored
        return
    for personal in (SESSION, USER, NAME, "dave@", "carol.jones"):
        assert personal not in stored, personal
        assert personal not in rendered, personal
    assert all(c.startswith("k:") for c in conversations)


def test_a_named_secret_reaches_the_database_in_no_part(backends: Backends, tmp_path: Path) -> None:
    """A quoted value with spaces, and tool-call arguments naming a secret: nothing of
    either is stored, in the history or in the body. (The emulator's answer echoes words
    of the prompt as prose, with no name to know them by: the request side is checked.)"""
    db = tmp_path / "records.db"
    proxy = start_recording_proxy(
        recorder_config(backends.hosted.url, backends.vllm.url, f"sqlite:///{db}", "redacted")
    )
    arguments = '{"user_name": "ops", "password": "hunter2 ostrich", "api_key": 904471}'
    messages = [
        {"role": "user", "content": 'log in; passphrase: "correct horse battery staple"'},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "login", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "logged in"},
    ]  # fmt: skip
    proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=messages)  # type: ignore[arg-type]
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 2)
    proxy.stop()

    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT request_json, request_messages FROM records").fetchall()
        rows += conn.execute("SELECT body, body FROM messages").fetchall()
    stored = "\n".join(str(cell) for row in rows for cell in row)
    assert "passphrase" in stored
    assert "password" in stored
    for word in ("correct", "horse", "battery", "staple", "hunter2", "ostrich", "904471"):
        assert word not in stored, word


# One secret per shape an outside probe found stored; each word unique, so a survivor
# names its shape.
SHAPED_SECRETS = {
    "yaml block": ("db:\n  password: |\n    Zq1yamlblock\n  user: bob", "Zq1yamlblock"),
    "numbered name": ("OPENAI_API_KEY_2=Zq2numbered", "Zq2numbered"),
    "xml": ("<apiKey>Zq3xmlvalue</apiKey>", "Zq3xmlvalue"),
    "cookie": ("Cookie: theme=dark; sessionid=Zq4cookie", "Zq4cookie"),
    "smart quotes": ("password: “Zq5smart horse”", "Zq5smart"),
    "triple quotes": ('password = """Zq6triple"""', "Zq6triple"),
    "unknown scheme": ("Authorization: SSWS Zq7scheme", "Zq7scheme"),
    "url password": ("postgres://admin:Zq8urlpw@db/app", "Zq8urlpw"),
    "flag": ("run --password Zq9flag", "Zq9flag"),
    "curl": ("curl -u admin:Zq10curl https://x", "Zq10curl"),
}


def test_every_secret_shape_reaches_the_database_in_no_part(
    backends: Backends, tmp_path: Path
) -> None:
    db = tmp_path / "records.db"
    proxy = start_recording_proxy(
        recorder_config(backends.hosted.url, backends.vllm.url, f"sqlite:///{db}", "redacted")
    )
    prompt = "\n".join(text for text, _ in SHAPED_SECRETS.values())
    arguments = '{"host": "db1", "apiKey2": "Zq11member", "pass": "Zq12member"}'
    messages = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "login", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]  # fmt: skip
    proxy.client().chat.completions.create(model=HOSTED_MODEL, messages=messages)  # type: ignore[arg-type]
    wait_until(lambda: proxy.recorder.stats.written + proxy.recorder.queue_depth >= 2)
    proxy.stop()

    stored = _everything_stored(db)
    assert "postgres://admin:" in stored  # the row is there, its secrets are not
    for shape, (_, secret) in SHAPED_SECRETS.items():
        assert secret not in stored, shape
    for member in ("Zq11member", "Zq12member"):
        assert member not in stored, member
