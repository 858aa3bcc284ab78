"""The record contract: what a redacted record may hold, field by field and with the reason,
for every route and role, after real SDK clients sent secrets in the prompt, the headers and
the query through a real recording proxy.

The records table's columns, the stored request and answer bodies' members and the
`messages` rows are compared with the allow-lists below exactly: a field stored without a
row here fails. Then no key and no secret of the prompt may appear anywhere in the records
database's bytes (WAL included) or in what the proxy logged, and each secret of the prompt
must read as docs/security.md says it is masked.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from edge_contracts import (
    ALL_SECRETS,
    AUTHS,
    CLIENT_HEADERS,
    CLIENT_QUERY,
    Auth,
    Mode,
)

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.recorder import build_recorder
from kvmigrate.serving import BackgroundServer

CANDIDATE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EMBEDDING = "text-embedding-3-small"
CLAUDE = "claude-sonnet-4-5"
SESSION = CLIENT_HEADERS["X-Session-ID"]

# The secrets a prompt carries, each with the form docs/security.md ("Redaction") says
# the records keep of its line.
PROMPT_KEY = "sk-proj-PROMPTKEY0009abcdefXYZ"
EMAIL = "alice.secret@example.com"
PASSWORD = "hunter2-PW-0011"
BEARER = "tok-BEARER-0012abc"
COOKIE = "cookie-PROMPT-0015"
PROMPT_LINES = {
    f"Use the key {PROMPT_KEY} now.": "Use the key [SECRET] now.",  # a vendor key
    f"Write to {EMAIL} today.": "Write to [EMAIL] today.",  # personal data
    f"password={PASSWORD}": "password=[SECRET]",  # a value named a secret
    f"Authorization: Bearer {BEARER}": "Authorization: [SECRET]",  # loses its credentials
    f"Cookie: theme=dark; sid={COOKIE}": "Cookie: [SECRET]",  # loses every cookie
}
PROMPT = "\n".join(PROMPT_LINES)
REDACTED_PROMPT = "\n".join(PROMPT_LINES.values())
PROMPT_SECRETS = (PROMPT_KEY, EMAIL, PASSWORD, BEARER, COOKIE)
# Credential headers a client may send besides the SDK's Authorization, each a secret of its
# own so that a leak names it.
API_KEY_SECRET = "api-key-SECRET-0013"
X_API_KEY_SECRET = "x-api-key-SECRET-0014"
EXTRA_HEADERS = {"api-key": API_KEY_SECRET, "x-api-key": X_API_KEY_SECRET}
SECRETS = (*ALL_SECRETS, *PROMPT_SECRETS, API_KEY_SECRET, X_API_KEY_SECRET, SESSION)


# -- the allow-lists ---------------------------------------------------------------------------

# Every column of `records`, and why a redacted record may hold it.
RECORD_COLUMNS: dict[str, str] = {
    "request_id": "the proxy's own id of the call (uuid), no client value",
    "ts": "when the call started",
    "route": "the API route (`chat/completions`): no query, no id from the client",
    "backend": "a backend's name from the config",
    "role": "serve, shadow or noise",
    "model": "the model name from the config's routes",
    "served_model": "what the backend calls the model, from the config",
    "conversation": "a keyed hash (`k:`) of a declared id, or a derived digest (`h:`)",
    "turn": "the turn's number",
    "stream": "whether the answer was streamed",
    "status": "the upstream's HTTP status",
    "error": "the error class (`http_<status>`, `timeout`, ...), never a message",
    "ttft_ms": "time to the first token",
    "latency_ms": "time to the last byte",
    "prompt_tokens": "usage, as the upstream reported it",
    "cached_tokens": "usage",
    "completion_tokens": "usage",
    "finish_reason": "the answer's finish reason",
    "tool_calls": "the names of the tools called, not their arguments",
    "fallback_from": "the backend a split fell back from",
    "pair_id": "the request id of the answer a copy shadows",
    "source": "the proxy process that recorded it",
    "content": "the content policy it was written under (`redacted`)",
    "request_json": "the request body, redacted, less its history (`request_messages`)",
    "response_json": "the assembled answer, redacted",
    "parity_kind": "parity: what the copy is (candidate, noise)",
    "parity_score": "parity: the score against the answer it copies",
    "parity_applicable": "parity: which measures applied",
    "parity_disagree": "parity: which measures disagreed",
    "parity_tool_agree": "parity: tool-call agreement",
    "parity_json_valid": "parity: JSON validity",
    "request_messages": "digests of the history's rows in `messages`",
    "identity": "how the proxy knew the conversation (`header`, `opening`, ...)",
    "cache_write_tokens": "usage: prompt-cache writes (Anthropic)",
    "cohort": "the rollout cohort, a name from the config",
    "response_id": "a keyed hash (`k:`) of the id of the answer the client got",
    "decode_ms": "a streamed answer's time from its first byte to its last chunk",
    "decode_chunks": "the chunks after the first: counts only",
    "chunk_gap_max_ms": "the longest wait between two chunks",
}
# Every table of the records database.
TABLES = {
    "records": "one row per upstream call",
    "messages": "each distinct history message once: digest, last_seen, the redacted body",
    "answered": "answers per process, role and minute: counts only",
    "unclean_stops": "proxy processes that ended without a clean stop: counts only",
    "migrations": "the schema's migrations applied",
    "feedback": "scores clients gave: keyed-hashed ids, a name, a value, a redacted comment",
    "engine_samples": "the candidates' scraped engine and GPU figures: numbers and errors",
}
MESSAGE_COLUMNS = {"digest", "last_seen", "body"}

ALWAYS = {
    "request_id", "ts", "route", "backend", "role", "model", "served_model", "conversation",
    "turn", "stream", "status", "latency_ms", "source", "content", "identity", "cohort",
}  # fmt: skip
PARITY = {"parity_kind", "parity_score", "parity_applicable", "parity_disagree"}
# A streamed answer the client got: its decode timing (the proxy's clock on relayed chunks).
DECODE = {"decode_ms", "decode_chunks", "chunk_gap_max_ms"}


def _user(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def _chat(client: openai.OpenAI) -> object:
    return client.chat.completions.create(model="gpt-4o-mini", messages=_user(PROMPT))  # type: ignore[arg-type]


def _chat_stream(client: openai.OpenAI) -> object:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=_user(PROMPT),  # type: ignore[arg-type]
        stream=True,
    )
    return [chunk for chunk in stream]


def _completion(client: openai.OpenAI) -> object:
    return client.completions.create(model="gpt-4o-mini", prompt=PROMPT)


def _response(client: openai.OpenAI) -> object:
    return client.responses.create(model="gpt-4o-mini", input=PROMPT)


UNKNOWN_ID = "resp_nobody-remembers-this"


def _chain_miss(client: openai.OpenAI) -> object:
    """A turn continuing a response no proxy stored: logged (the calibration of the log)."""
    with pytest.raises(openai.NotFoundError):  # the primary never stored it either
        client.responses.create(model="gpt-4o-mini", input=PROMPT, previous_response_id=UNKNOWN_ID)
    return None


def _embedding(client: openai.OpenAI) -> object:
    return client.embeddings.create(model=EMBEDDING, input=PROMPT)


def _message(client: anthropic.Anthropic) -> object:
    return client.messages.create(model=CLAUDE, max_tokens=32, messages=_user(PROMPT))  # type: ignore[arg-type]


def _message_stream(client: anthropic.Anthropic) -> object:
    with client.messages.stream(
        model=CLAUDE,
        max_tokens=32,
        messages=_user(PROMPT),  # type: ignore[arg-type]
    ) as stream:
        return stream.get_final_message()


@dataclass
class Recorded:
    """What one proxy recorded and logged, read after it stopped."""

    db: Path
    rows: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    tables: set[str]
    columns: list[str]
    log: str

    def db_bytes(self) -> bytes:
        """Every byte of the records database: the file, its WAL, its shared memory, the
        writers' lock (the spool, documented as unredacted, is removed once written)."""
        return b"".join(
            p.read_bytes() for p in sorted(self.db.parent.glob(self.db.name + "*")) if p.is_file()
        )


EMULATORS = {
    "openai": EmulatorSettings("hosted", time_scale=0, models=("gpt-4o-mini", EMBEDDING)),
    "anthropic": EmulatorSettings("anthropic", time_scale=0),
}
MODELS = {
    "openai": f"""
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {CANDIDATE_MODEL}}}
  - {{model_name: {EMBEDDING}, hosted: {EMBEDDING}, vllm: {EMBEDDING}}}""",
    "anthropic": f"\n  - {{model_name: {CLAUDE}, hosted: {CLAUDE}, vllm: {CANDIDATE_MODEL}}}",
}


def record_traffic(
    api: str,
    auth: Auth,
    calls: list[Callable[[Any], object]],
    expected: int,
    root: Path,
    log: Callable[[], str],
) -> Recorded:
    """`calls` through a recording proxy in shadow mode (every conversation copied and
    sent to the primary twice), then the records once `expected` are written."""
    primary = BackgroundServer(lambda: build_app(EMULATORS[api]))
    vllm = BackgroundServer(
        lambda: build_app(
            EmulatorSettings("vllm", time_scale=0, models=(CANDIDATE_MODEL, EMBEDDING))
        )
    )
    db = root / "records.db"
    with primary, vllm:
        kind = ", type: anthropic" if api == "anthropic" else ""
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{primary.url}/v1", read_timeout: 10{kind} {auth.primary_extra()}}}
  vllm: {{api_base: "{vllm.url}/v1", read_timeout: 10 {auth.candidate_extra()}}}
models: {MODELS[api]}
rollout: {{mode: shadow, shadow_sample: 1.0, noise_sample: 1.0, noise_per_minute: 1000}}
record: {{db: "sqlite:///{db}"}}
{auth.server()}
""",
            env={},
        )
        assert config.record.content == "redacted"  # the default under test
        recorder = build_recorder(config)
        with BackgroundServer(lambda: build_proxy_app(config, addons=[recorder])) as proxy:
            client: Any
            if api == "openai":
                client = openai.OpenAI(
                    base_url=proxy.url + "/v1",
                    api_key=auth.client_key,
                    max_retries=0,
                    default_headers={**CLIENT_HEADERS, **EXTRA_HEADERS},
                    default_query=CLIENT_QUERY,
                )
            else:
                client = anthropic.Anthropic(
                    base_url=proxy.url,
                    api_key=auth.client_key,
                    max_retries=0,
                    default_headers={
                        **CLIENT_HEADERS,
                        "api-key": API_KEY_SECRET,
                        "Authorization": "Bearer " + auth.client_key,
                    },
                    default_query=CLIENT_QUERY,
                )
            with client:
                for call in calls:
                    call(client)
            # A copy comes after its answer: a generous deadline, not a bound under test.
            deadline = time.monotonic() + 60
            while recorder.stats.written < expected and time.monotonic() < deadline:
                time.sleep(0.02)
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM records ORDER BY ts")]
        messages = [dict(r) for r in conn.execute("SELECT * FROM messages")]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        columns = [r[1] for r in conn.execute("PRAGMA table_info(records)")]
    conn.close()
    return Recorded(db, rows, messages, tables, columns, log())


# -- what each route's records hold ------------------------------------------------------------

USAGE = {"prompt_tokens", "completion_tokens", "cached_tokens"}
BODIES = {"request_json", "response_json"}
HISTORY = {"request_messages"}  # chat and Messages: the history lives in `messages`
COPY = {"pair_id", *PARITY}  # a shadow copy or a noise call, scored against its answer


@dataclass(frozen=True)
class Route:
    """A client call, and what its records hold beyond ALWAYS, by role: the columns set
    (`filled`) and the stored request body's members (`request`)."""

    name: str
    api: str
    route: str
    stream: bool
    call: Callable[[Any], object]
    filled: dict[str, set[str]]
    request: dict[str, set[str]]


def _each(
    filled: set[str], request: set[str], **copies: set[str]
) -> tuple[dict[str, set[str]], ...]:
    """The serve record's fields, and a copy's: the same plus COPY; `copies` adds to
    (`shadow_add`, `noise_add`) or takes from (`..._less`) a role's."""
    # Only the served answer's id is kept: the client saw no copy's (feedback names it).
    served = filled | {"response_id"}
    roles: dict[str, set[str]] = {"serve": served, "shadow": filled | COPY, "noise": filled | COPY}
    bodies = {"serve": request, "shadow": set(request), "noise": set(request)}
    for name, extra in copies.items():
        role, how = name.split("_")
        table = bodies if how == "body" else roles
        table[role] = table[role] | extra if how in ("add", "body") else table[role] - extra
    return roles, bodies


ROUTES = (
    Route("chat", "openai", "chat/completions", False, _chat,
          *_each(USAGE | BODIES | HISTORY | {"finish_reason"}, {"model"})),
    # The client asked no usage of a stream: the proxy asks it for its own copies only.
    Route("chat-stream", "openai", "chat/completions", True, _chat_stream,
          *_each(BODIES | HISTORY | {"finish_reason", "ttft_ms"}, {"model", "stream"},
                 shadow_add=USAGE, noise_add=USAGE,
                 shadow_body={"stream_options"}, noise_body={"stream_options"})),
    # The emulated vLLM reports cached tokens where the hosted API's completions do not.
    Route("completions", "openai", "completions", False, _completion,
          *_each(USAGE - {"cached_tokens"} | BODIES | {"finish_reason"}, {"model", "prompt"},
                 shadow_add={"cached_tokens"})),
    Route("responses", "openai", "responses", False, _response,
          *_each(USAGE | BODIES | {"finish_reason"}, {"model", "input"})),
    # An embedding is a vector: no answer is kept, and nothing to score.
    Route("embeddings", "openai", "embeddings", False, _embedding,
          *_each({"prompt_tokens", "request_json"}, {"model", "input", "encoding_format"},
                 shadow_less=PARITY, noise_less=PARITY, shadow_add={"completion_tokens"},
                 serve_less={"response_id"})),
    Route("messages", "anthropic", "messages", False, _message,
          *_each(USAGE | BODIES | HISTORY | {"finish_reason", "cache_write_tokens"},
                 {"model", "max_tokens"})),
    Route("messages-stream", "anthropic", "messages", True, _message_stream,
          *_each(USAGE | BODIES | HISTORY | {"finish_reason", "cache_write_tokens", "ttft_ms"},
                 {"model", "max_tokens", "stream"})),
)  # fmt: skip
ROLES = ("serve", "shadow", "noise")
# The members an answer may have: the upstream's own, as it sent them (redacted).
ANSWER_MEMBERS = {
    "chat/completions": {
        "id", "object", "created", "model", "choices", "usage", "system_fingerprint",
        "service_tier", "kv_transfer_params", "prompt_logprobs", "prompt_token_ids",
    },
    "completions": {
        "id", "object", "created", "model", "choices", "usage", "system_fingerprint",
        "service_tier", "kv_transfer_params",
    },
    "responses": {
        "id", "object", "created_at", "status", "background", "error", "incomplete_details",
        "instructions", "max_output_tokens", "metadata", "model", "output",
        "parallel_tool_calls", "previous_response_id", "reasoning", "service_tier", "store",
        "temperature", "text", "tool_choice", "tools", "top_p", "truncation", "usage", "user",
    },
    "messages": {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"},
}  # fmt: skip
# Where the prompt's text is kept, redacted: the request body, or the history's rows.
PROMPT_MEMBER = {"completions": "prompt", "responses": "input", "embeddings": "input"}


@pytest.fixture(
    scope="module",
    params=[a for a in AUTHS if not a.candidate_key or a.mode is Mode.MASTER_KEY],
    ids=str,
)
def recorded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Recorded]]:
    """Every route's traffic, recorded once per key mode and API."""
    auth: Auth = request.param
    handler = _LogBuffer()
    loggers = [logging.getLogger(name) for name in ("kvmigrate", "aiohttp")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.DEBUG)
    try:
        out = {}
        for api in ("openai", "anthropic"):
            routes = [r for r in ROUTES if r.api == api]
            root = tmp_path_factory.mktemp(f"records-{api}")
            calls = [r.call for r in routes] + ([_chain_miss] if api == "openai" else [])
            out[api] = record_traffic(api, auth, calls, 3 * len(routes), root, handler.text)
        yield out
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)


class _LogBuffer(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))

    def text(self) -> str:
        return "\n".join(self.lines)


def test_the_schema_holds_only_the_fields_of_the_table(recorded: dict[str, Recorded]) -> None:
    """A column or a table added without its reason here fails."""
    for api in recorded.values():
        assert set(api.columns) == set(RECORD_COLUMNS)
        assert api.tables == set(TABLES)
        for row in api.messages:
            assert set(row) == MESSAGE_COLUMNS


def _plain(api: Recorded) -> list[dict[str, Any]]:
    """The records of the routes' own calls, less the chain miss's."""
    return [r for r in api.rows if "previous_response_id" not in json.loads(r["request_json"])]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_each_record_holds_exactly_its_fields(
    recorded: dict[str, Recorded], route: Route, role: str
) -> None:
    plain = _plain(recorded[route.api])
    rows = [
        r
        for r in plain
        if r["route"] == route.route and bool(r["stream"]) is route.stream and r["role"] == role
    ]
    assert len(rows) == 1, rows
    row = rows[0]
    filled = {c for c, v in row.items() if v is not None}
    assert filled - DECODE == ALWAYS | route.filled[role]
    # Decode timing needs chunks after the first: a stream that arrived in one read has none.
    assert filled & DECODE in (set(), DECODE if route.stream else set())
    assert set(json.loads(row["request_json"])) == route.request[role]
    if row["response_json"] is not None:
        assert set(json.loads(row["response_json"])) <= ANSWER_MEMBERS[route.route]
    assert row["content"] == "redacted"
    assert row["identity"] == "header"
    # The declared session id is personal data: a keyed hash, the same for each record.
    assert row["conversation"].startswith("k:")
    assert len(row["conversation"]) == 2 + 24
    assert {r["conversation"] for r in plain} == {row["conversation"]}


def test_a_turn_nobody_remembers_is_recorded_with_its_fields(
    recorded: dict[str, Recorded],
) -> None:
    """The chain miss's records: the responses route's fields, and the id it named."""
    rows = [r for r in recorded["openai"].rows if "previous_response_id" in r["request_json"]]
    # The primary refused it: no copy to the candidate (it has no such chain either); the
    # second call to the primary measures the primary's own agreement, refusals included.
    assert sorted(r["role"] for r in rows) == ["noise", "serve"]
    for row in rows:
        _is_the_miss(row)


def _is_the_miss(row: dict[str, Any]) -> None:
    assert json.loads(row["request_json"]) == {
        "model": "gpt-4o-mini",
        "input": REDACTED_PROMPT,
        "previous_response_id": UNKNOWN_ID,
    }
    assert (row["status"], row["error"], row["identity"]) == (404, "http_404", "guess")
    filled = {c for c, v in row.items() if v is not None}
    allowed = {"request_json", "response_json", "error"} | (
        COPY if row["role"] == "noise" else set()
    )
    assert filled - ALWAYS <= allowed


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.name)
def test_the_prompt_is_kept_in_the_form_the_docs_give(
    recorded: dict[str, Recorded], route: Route
) -> None:
    """docs/security.md, "Redaction": the key and the password masked, the email too, and
    an Authorization line loses its credentials; the rest of each line is kept."""
    api = recorded[route.api]
    for row in api.rows:
        if row["route"] != route.route:
            continue
        if route.route in PROMPT_MEMBER:
            assert json.loads(row["request_json"])[PROMPT_MEMBER[route.route]] == REDACTED_PROMPT
        else:  # the history, one row per message
            (digest,) = json.loads(row["request_messages"])["messages"]
            (body,) = [json.loads(m["body"]) for m in api.messages if m["digest"] == digest]
            assert body == {"role": "user", "content": REDACTED_PROMPT}


def test_no_secret_reaches_the_database_or_the_log(recorded: dict[str, Recorded]) -> None:
    """No key (the client's, the master key, the backends'), no credential header or query
    parameter, no secret of the prompt and no declared session id, in any byte of the
    records database (its WAL included) or any line the proxy logged."""
    for name, api in recorded.items():
        data = api.db_bytes()
        assert data  # the files were read
        assert [s for s in SECRETS if s.encode() in data] == [], name
        assert [s for s in SECRETS if s in api.log] == [], name
    # Calibration: the log was captured (the chain miss is logged, naming the id).
    assert UNKNOWN_ID in recorded["openai"].log
