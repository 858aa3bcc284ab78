"""Every error the proxy makes itself, on every route family: its status, its code, the
exact envelope its clients know (OpenAI's, or Anthropic's below /v1/messages), and a message
that shows nothing of the proxy's insides: no address, no port of any server in play, no
file path, no traceback, no exception class.

Before, the suite checked a 502's status and code: the same 502 carrying the HTTP client's
exception text (`Cannot connect to host 127.0.0.1:PORT ...`) would have passed.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from edge_contracts import MASTER_KEY, anthropic_error, internals_in, openai_error

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

CANDIDATE_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CHAT = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = json.dumps(
    {"model": "gpt-4o-mini", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
)
SPLIT = "{mode: split, percent: 100, shadow_sample: 0, noise_sample: 0, fallback: false}"


@dataclass(frozen=True)
class Case:
    """One error: the config that makes it, the request, and what the client must get."""

    name: str
    status: int
    code: str | None
    path: str = "/v1/chat/completions"
    body: bytes = CHAT.encode()
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"
    hosted: str = "live"  # live | dead (nothing listens)
    vllm: str = "live"
    rollout: str = "{mode: shadow, shadow_sample: 0, noise_sample: 0}"
    server: str = ""
    hosted_extra: str = ""
    read_timeout: float = 5


CASES = (
    Case("bad json", 400, None, body=b"{not json"),
    Case("not an object", 400, None, body=b"[]"),
    Case("empty body", 400, None, body=b""),
    Case(
        "unknown model", 404, "model_not_found", body=CHAT.replace("gpt-4o-mini", "nope").encode()
    ),
    Case(
        "too large",
        413,
        "request_too_large",
        body=b"{" + b" " * 5000 + b"}",
        server="max_body_bytes: 2048",
    ),
    Case(
        "bad gzip", 400, None, headers={"Content-Encoding": "gzip"}, body=b"\x1f\x8bnot gzip at all"
    ),
    Case(
        "unsupported coding",
        415,
        "unsupported_content_encoding",
        headers={"Content-Encoding": "br"},
    ),
    Case("encoded separator", 400, None, path="/v1/chat%2Fcompletions"),
    Case("dot segments", 400, None, path="/v1/a/%2e%2e/b"),
    Case("no such route", 404, None, path="/v2/anything"),
    Case("missing key", 401, "invalid_api_key", server=f"master_key: {MASTER_KEY}"),
    Case(
        "wrong key",
        401,
        "invalid_api_key",
        headers={"Authorization": "Bearer sk-wrong"},
        server=f"master_key: {MASTER_KEY}",
    ),
    Case("primary unreachable", 502, "upstream_unreachable", hosted="dead"),
    Case(
        "primary timeout",
        504,
        "upstream_timeout",
        headers={"x-emulator-fault": "hang"},
        read_timeout=0.3,
    ),
    Case(
        "candidate down in split",
        502,
        "upstream_unreachable",
        vllm="dead",
        rollout=SPLIT,
        hosted_extra=", api_key: sk-own",
    ),
    Case("key unverifiable", 503, "key_verification_unavailable", hosted="dead", rollout=SPLIT),
    Case(
        "pass-through route, primary down",
        502,
        "upstream_unreachable",
        path="/v1/moderations",
        hosted="dead",
    ),
    Case(
        "metrics without its key",
        401,
        "invalid_api_key",
        method="GET",
        path="/metrics",
        server="metrics_key: sk-metrics",
    ),
    # The Messages routes answer in Anthropic's envelope.
    Case("messages: bad json", 400, None, path="/v1/messages", body=b"{not json"),
    Case(
        "messages: wrong key",
        401,
        None,
        path="/v1/messages",
        body=MESSAGES.encode(),
        headers={"x-api-key": "sk-wrong"},
        server=f"master_key: {MASTER_KEY}",
    ),
    Case(
        "messages: primary unreachable",
        502,
        None,
        path="/v1/messages",
        body=MESSAGES.encode(),
        hosted="dead",
    ),
    Case(
        "messages: too large",
        413,
        None,
        path="/v1/messages",
        body=b"{" + b" " * 5000 + b"}",
        server="max_body_bytes: 2048",
    ),
)


@pytest.fixture(scope="module")
def live() -> Iterator[dict[str, BackgroundServer]]:
    servers = {
        "hosted": BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0))),
        "vllm": BackgroundServer(
            lambda: build_app(EmulatorSettings("vllm", time_scale=0, models=(CANDIDATE_MODEL,)))
        ),
    }
    with servers["hosted"], servers["vllm"]:
        yield servers


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound and never listening: a connection to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def request(url: str, case: Case) -> tuple[int, dict[str, str], bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        headers = {"Content-Type": "application/json", **case.headers}
        conn.request(case.method, case.path, body=case.body or None, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_proxy_made_error_says_what_failed_and_nothing_of_the_insides(
    live: dict[str, BackgroundServer], dead_port: int, case: Case
) -> None:
    dead = f"http://127.0.0.1:{dead_port}"
    hosted = live["hosted"].url if case.hosted == "live" else dead
    vllm = live["vllm"].url if case.vllm == "live" else dead
    config = parse_config(
        f"""
server: {{{case.server}}}
backends:
  hosted: {{api_base: "{hosted}/v1", read_timeout: {case.read_timeout} {case.hosted_extra}}}
  vllm: {{api_base: "{vllm}/v1", read_timeout: 5, connect_timeout: 1}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {CANDIDATE_MODEL}}}
rollout: {case.rollout}
""",
        env={},
    )
    with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
        status, headers, body = request(proxy.url, case)
        ports = (
            int(proxy.url.rpartition(":")[2]),
            int(live["hosted"].url.rpartition(":")[2]),
            int(live["vllm"].url.rpartition(":")[2]),
            dead_port,
        )
    assert status == case.status, body
    assert headers["Content-Type"].startswith("application/json")
    if case.path.startswith("/v1/messages"):
        error = anthropic_error(body)
    else:
        error = openai_error(body)
        assert error["code"] == case.code, error
        assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    message = str(error["message"])
    assert internals_in(message, ports) == [], message
    assert MASTER_KEY not in body.decode()
    assert "sk-wrong" not in body.decode()


def test_a_connection_error_names_the_backend_by_its_config_name_only(
    live: dict[str, BackgroundServer], dead_port: int
) -> None:
    """The 502's whole message, word for word: the backend's name from the config, never
    its URL (which may hold a host name, a port or a password)."""
    config = parse_config(
        f"""
backends:
  hosted: {{api_base: "http://user:pw-SECRET@127.0.0.1:{dead_port}/v1"}}
  vllm: {{api_base: "{live["vllm"].url}/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {CANDIDATE_MODEL}}}
rollout: {{mode: shadow, shadow_sample: 0}}
""",
        env={},
    )
    with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
        status, _, body = request(proxy.url, Case("unreachable", 502, "upstream_unreachable"))
    assert status == 502
    assert openai_error(body) == {
        "message": "Backend `hosted` could not be reached.",
        "type": "server_error",
        "param": None,
        "code": "upstream_unreachable",
    }


def test_the_checker_finds_what_a_leaky_message_would_show() -> None:
    """The contract's own check, against messages an HTTP client's exception would make."""
    leaky = {
        "Cannot connect to host 127.0.0.1:8123 ssl:default [Connection refused]": 3,
        "ClientConnectorError: [Errno 111] Connect call failed": 2,
        'Traceback (most recent call last):\n  File "/work/kvmigrate/proxy/forward.py", line 9, in f': 2,
        "upstream localhost:8123 timed out": 2,
    }
    for message, at_least in leaky.items():
        assert len(internals_in(message, (8123,))) >= at_least, message
    assert internals_in("Backend `hosted` could not be reached.", (8123,)) == []
    assert gzip.decompress(gzip.compress(b"x")) == b"x"  # the bad-gzip row's premise
