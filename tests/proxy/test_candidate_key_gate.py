"""The pass-through mode (no master key, no key on the primary): a request reaches the
candidate, to be served or as a shadow copy, only with a key the primary accepted.

The primary here is a real server that checks a key as OpenAI's API does and records every
call; the candidate records what reaches it. Each row says what the client got (status and
message), what the primary was asked, and that the candidate saw nothing it should not.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

import openai
import pytest
from aiohttp import web
from proxy_support import CHAT_COMPLETION, HOSTED_MODEL, VLLM_MODEL, Recorded, proxy_config

from kvmigrate.cli import main
from kvmigrate.config import parse_config
from kvmigrate.config.access import AuthMode, auth_mode, describe_auth
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

GOOD_KEY = "sk-good-key-0123456789"
# An API management front end's own key header, which the primary also accepts.
APIM_KEY = "apim-good"
# The only project the good key may name.
OWN_PROJECT = "proj_A"
# Near misses: a prefix of the good key, the good key with more after it, another case.
NEAR_MISSES = (GOOD_KEY[:-1], GOOD_KEY + "0", GOOD_KEY.upper(), " " + GOOD_KEY, "")


@dataclass
class Primary:
    """A primary that checks `Authorization: Bearer GOOD_KEY` before anything else, as
    OpenAI's API does, and records what reaches it."""

    seen: list[Recorded] = field(default_factory=list)
    models_status: int | None = None  # set: /v1/models answers this instead

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append(Recorded(request.method, request.path_qs, dict(request.headers), body))
        if request.path == "/v1/models" and self.models_status is not None:
            return web.json_response({"error": {"message": "down"}}, status=self.models_status)
        if "X-Break" in request.headers:  # a front end's complaint before any key is read
            return web.json_response({"error": {"message": "Malformed request"}}, status=400)
        authorized = (
            request.headers.get("Authorization") == f"Bearer {GOOD_KEY}"
            or request.headers.get("Ocp-Apim-Subscription-Key") == APIM_KEY
            or request.headers.get("X-Tenant") == "t1"  # a name that gives nothing away
        )
        if not authorized or request.headers.get("OpenAI-Project", OWN_PROJECT) != OWN_PROJECT:
            return web.json_response(
                {
                    "error": {
                        "message": "Incorrect API key provided (primary's own words).",
                        "type": "invalid_request_error",
                        "param": None,
                        "code": "invalid_api_key",
                    }
                },
                status=401,
            )
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        return web.json_response(CHAT_COMPLETION)

    def calls(self, method: str, path: str) -> int:
        return sum(1 for r in self.seen if r.method == method and r.path == path)


@dataclass
class Bed:
    primary: Primary
    candidate_seen: list[Recorded]
    proxy: BackgroundServer


def recording_candidate(seen: list[Recorded]) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(Recorded(request.method, request.path_qs, dict(request.headers), body))
        return web.json_response(CHAT_COMPLETION)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@pytest.fixture
def bed_factory() -> Iterator[object]:
    running: list[BackgroundServer] = []

    def make(rollout: str, primary: Primary | None = None, extra: str = "") -> Bed:
        primary = primary or Primary()
        seen: list[Recorded] = []
        hosted = BackgroundServer(primary.app).start()
        candidate = BackgroundServer(lambda: recording_candidate(seen)).start()
        config = proxy_config(hosted.url, candidate.url, rollout, extra=extra)
        proxy = BackgroundServer(lambda: build_proxy_app(config)).start()
        running.extend([proxy, hosted, candidate])
        return Bed(primary, seen, proxy)

    yield make
    for server in running:
        server.stop()


def exchange(
    url: str, headers: list[tuple[str, str]], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one POST whose headers go as listed (a name twice too)."""
    body = json.dumps({"model": HOSTED_MODEL, "messages": [{"role": "user", "content": "hi"}]})
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", path)
    for name, value in [("Content-Type", "application/json"), *headers]:
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body.encode())
    response = conn.getresponse()
    answer = response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    conn.close()
    return answer


def chat(url: str, key: str | None, session: str = "s-1", path: str = "/v1/chat/completions"):
    headers = [("X-Session-ID", session)]
    if key is not None:
        headers.append(("Authorization", f"Bearer {key}"))
    status, _, body = exchange(url, headers, path)
    return status, json.loads(body)


@pytest.mark.parametrize("key", [None, *NEAR_MISSES])
def test_split_refuses_a_key_the_primary_refuses(bed_factory, key: str | None) -> None:
    bed = bed_factory("{mode: split, percent: 100}")
    status, data = chat(bed.proxy.url, key)
    assert status == 401
    assert data["error"]["message"] == "Incorrect API key provided (primary's own words)."
    assert data["error"]["code"] == "invalid_api_key"
    assert bed.candidate_seen == []
    # The primary was asked about the key (its model list), and served nothing.
    assert [(r.method, r.path) for r in bed.primary.seen] == [("GET", "/v1/models")]
    asked = {k.lower(): v for k, v in bed.primary.seen[0].headers.items()}
    assert asked.get("authorization") == (None if key is None else f"Bearer {key}".strip())
    # The question is the proxy's own: the client's credentials, none of its other headers.
    assert "x-session-id" not in asked
    assert "content-type" not in asked
    assert bed.primary.seen[0].body == b""


def test_split_serves_a_key_the_primary_accepted_asking_once(bed_factory) -> None:
    bed = bed_factory("{mode: split, percent: 100}")
    for i in range(3):
        status, data = chat(bed.proxy.url, GOOD_KEY, session=f"s-{i}")
        assert status == 200, data
        assert data["choices"][0]["message"]["content"] == "ok"
    assert bed.primary.calls("GET", "/v1/models") == 1  # the verdict is kept
    assert bed.primary.calls("POST", "/v1/chat/completions") == 0
    assert len(bed.candidate_seen) == 3
    for recorded in bed.candidate_seen:
        sent = {k.lower() for k in recorded.headers}
        assert "authorization" not in sent
        assert "api-key" not in sent


def test_an_acceptance_lasts_client_key_ttl_seconds_then_the_primary_is_asked_again(
    bed_factory,
) -> None:
    """A key the primary revoked without a 401 reaching the proxy (it never sends one
    there) stops reaching the candidate within the TTL: the verdict is kept that long only."""
    bed = bed_factory("{mode: split, percent: 100}", extra="server: {client_key_ttl_seconds: 1}")
    assert chat(bed.proxy.url, GOOD_KEY, session="s-1")[0] == 200
    assert chat(bed.proxy.url, GOOD_KEY, session="s-2")[0] == 200
    assert bed.primary.calls("GET", "/v1/models") == 1  # kept within the TTL
    time.sleep(1.3)
    assert chat(bed.proxy.url, GOOD_KEY, session="s-3")[0] == 200
    assert bed.primary.calls("GET", "/v1/models") == 2  # asked again once it expired
    bed.primary.models_status = 401  # revoked: the next question is refused
    time.sleep(1.3)
    status, data = chat(bed.proxy.url, GOOD_KEY, session="s-4")
    assert status == 401
    assert data["error"]["message"] == "down"
    assert bed.primary.calls("GET", "/v1/models") == 3
    assert len(bed.candidate_seen) == 3


def test_concurrent_requests_with_a_new_key_ask_the_primary_once(bed_factory) -> None:
    bed = bed_factory("{mode: split, percent: 100}")

    async def burst() -> list[int]:
        client = openai.AsyncOpenAI(base_url=bed.proxy.url + "/v1", api_key=GOOD_KEY, max_retries=0)
        async with client:
            calls = [
                client.chat.completions.with_raw_response.create(
                    model=HOSTED_MODEL, messages=[{"role": "user", "content": f"q{i}"}]
                )
                for i in range(8)
            ]
            return [r.status_code for r in await asyncio.gather(*calls)]

    assert asyncio.run(burst()) == [200] * 8
    assert bed.primary.calls("GET", "/v1/models") == 1
    assert len(bed.candidate_seen) == 8


def test_at_fifty_percent_no_keyless_session_reaches_the_candidate(bed_factory) -> None:
    """Trying X-Session-ID values without a key finds no conversation the candidate serves:
    every one is refused with the primary's own words, wherever its bucket is."""
    bed = bed_factory("{mode: split, percent: 50, noise_sample: 0}")
    answers = [chat(bed.proxy.url, None, session=f"probe-{i}") for i in range(24)]
    assert {status for status, _ in answers} == {401}
    assert {d["error"]["message"] for _, d in answers} == {
        "Incorrect API key provided (primary's own words)."
    }
    assert bed.candidate_seen == []
    # With the key, the same sessions split between the two, and the primary's half is
    # shadowed to the candidate (split mode shadows the conversations it does not move).
    refused_on_primary = bed.primary.calls("POST", "/v1/chat/completions")
    assert 0 < refused_on_primary < 24  # both buckets were tried without a key
    served = {chat(bed.proxy.url, GOOD_KEY, session=f"probe-{i}")[0] for i in range(24)}
    assert served == {200}
    assert bed.primary.calls("POST", "/v1/chat/completions") == 2 * refused_on_primary
    deadline = time.monotonic() + 30  # the copies follow the answers
    while len(bed.candidate_seen) < 24 and time.monotonic() < deadline:
        time.sleep(0.01)
    sessions = sorted(r.headers["X-Session-ID"] for r in bed.candidate_seen)
    assert sessions == sorted(f"probe-{i}" for i in range(24))


@pytest.mark.parametrize("models_status", [500, 404, 429])
def test_a_primary_that_cannot_say_keeps_the_candidate_closed(
    bed_factory, models_status: int
) -> None:
    bed = bed_factory("{mode: split, percent: 100}", Primary(models_status=models_status))
    status, data = chat(bed.proxy.url, GOOD_KEY)
    assert status == 503
    assert data["error"]["code"] == "key_verification_unavailable"
    assert "could not be verified" in data["error"]["message"]
    assert "127.0.0.1" not in data["error"]["message"]
    assert bed.candidate_seen == []
    # No verdict was kept: the next request asks again.
    chat(bed.proxy.url, GOOD_KEY)
    assert bed.primary.calls("GET", "/v1/models") == 2


def test_an_unreachable_primary_keeps_the_candidate_closed(bed_factory) -> None:
    seen: list[Recorded] = []
    with BackgroundServer(lambda: recording_candidate(seen)) as candidate:
        config = proxy_config("http://127.0.0.1:9", candidate.url, "{mode: split, percent: 100}")
        with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
            status, data = chat(proxy.url, GOOD_KEY)
    assert status == 503
    assert data["error"]["code"] == "key_verification_unavailable"
    assert ":9" not in data["error"]["message"]
    assert seen == []


@pytest.mark.parametrize("primary_failures", ["false", "true"])
def test_shadow_never_shadows_what_the_primary_refused(bed_factory, primary_failures: str) -> None:
    bed = bed_factory(
        f"{{mode: shadow, shadow_sample: 1.0, noise_sample: 0, "
        f"shadow_primary_failures: {primary_failures}}}"
    )
    for key in (None, GOOD_KEY[:-1]):
        status, data = chat(bed.proxy.url, key, session="refused")
        assert status == 401
        assert data["error"]["message"] == "Incorrect API key provided (primary's own words)."
    status, _ = chat(bed.proxy.url, GOOD_KEY, session="accepted")
    assert status == 200
    # The accepted request's copy is the marker that every earlier copy was dispatched.
    deadline = time.monotonic() + 30  # the copy follows the answer: a deadline, not a bound
    while not bed.candidate_seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert len(bed.candidate_seen) == 1
    assert b"hi" in bed.candidate_seen[0].body
    assert "x-session-id" in {k.lower() for k in bed.candidate_seen[0].headers}
    assert bed.candidate_seen[0].headers.get("X-Session-ID") == "accepted"
    # In shadow mode the primary's own answers are the verdicts: no extra question.
    assert bed.primary.calls("GET", "/v1/models") == 0


def test_a_response_stored_on_the_candidate_is_read_only_with_an_accepted_key() -> None:
    """A Responses chain the candidate stored: reading it (GET) or continuing it needs a
    key the primary accepts, as it would on the primary."""
    primary = Primary()
    vllm = EmulatorSettings(profile="vllm", time_scale=0)
    with (
        BackgroundServer(primary.app) as hosted,
        BackgroundServer(lambda: build_app(vllm)) as candidate,
    ):
        config = proxy_config(hosted.url, candidate.url, "{mode: split, percent: 100}")
        with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
            good = openai.OpenAI(base_url=proxy.url + "/v1", api_key=GOOD_KEY, max_retries=0)
            stored = good.responses.create(model=HOSTED_MODEL, input="remember 42")
            assert good.responses.retrieve(stored.id).id == stored.id
            for key in ("sk-made-up", GOOD_KEY[:-1]):
                bad = openai.OpenAI(base_url=proxy.url + "/v1", api_key=key, max_retries=0)
                with pytest.raises(openai.AuthenticationError) as read:
                    bad.responses.retrieve(stored.id)
                assert "primary's own words" in read.value.message
                with pytest.raises(openai.AuthenticationError) as continued:
                    bad.responses.create(
                        model=HOSTED_MODEL, input="and?", previous_response_id=stored.id
                    )
                assert "primary's own words" in continued.value.message
                bad.close()
            good.close()


def test_a_model_only_the_candidate_serves_still_needs_an_accepted_key() -> None:
    """Such a model is sent before its conversation is known (as in shadow mode): not with
    a key the primary has not vouched for."""
    seen: list[Recorded] = []
    primary = Primary()
    with (
        BackgroundServer(primary.app) as hosted,
        BackgroundServer(lambda: recording_candidate(seen)) as candidate,
    ):
        config = parse_config(
            f"""
backends:
  hosted: {{api_base: "{hosted.url}/v1"}}
  vllm: {{api_base: "{candidate.url}/v1"}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: {VLLM_MODEL}}}
  - {{model_name: local-only, vllm: {VLLM_MODEL}}}
rollout: {{mode: shadow}}
""",
            env={},
        )
        with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
            body = json.dumps(
                {"model": "local-only", "messages": [{"role": "user", "content": "x"}]}
            )
            host, port = proxy.url.removeprefix("http://").split(":")
            for key, expected in (("sk-nope", 401), (GOOD_KEY, 200)):
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                conn.request(
                    "POST",
                    "/v1/chat/completions",
                    body=body,
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
                )
                response = conn.getresponse()
                assert response.status == expected, response.read()
                response.read()
                conn.close()
    assert len(seen) == 1
    assert b"local-only" not in seen[0].body
    assert VLLM_MODEL.encode() in seen[0].body


def test_a_refusal_on_the_messages_route_is_the_primarys_own(bed_factory) -> None:
    bed = bed_factory("{mode: split, percent: 100}")
    body = json.dumps(
        {"model": HOSTED_MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    )
    host, port = bed.proxy.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(
        "POST",
        "/v1/messages",
        body=body,
        headers={"Content-Type": "application/json", "x-api-key": "sk-ant-made-up"},
    )
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    # As the primary's own refusal of a request it serves would reach the client: relayed.
    assert response.status == 401
    assert data["error"]["message"] == "Incorrect API key provided (primary's own words)."
    assert bed.candidate_seen == []
    assert bed.primary.seen[-1].headers["x-api-key"] == "sk-ant-made-up"


@pytest.mark.parametrize(
    ("server", "hosted", "mode"),
    [
        ("", "", AuthMode.PASS_THROUGH),
        ("server: {master_key: sk-m}", "", AuthMode.MASTER_KEY),
        ("", ", api_key: sk-org", AuthMode.OPEN),
        ("server: {master_key: sk-m}", ", api_key: sk-org", AuthMode.MASTER_KEY),
    ],
)
def test_the_mode_in_force_is_said(server: str, hosted: str, mode: AuthMode) -> None:
    config = parse_config(
        f"""
{server}
backends:
  hosted: {{api_base: "http://127.0.0.1:1/v1"{hosted}}}
  vllm: {{api_base: "http://127.0.0.1:2/v1"}}
models:
  - {{model_name: m, hosted: m, vllm: m}}
""",
        env={},
    )
    assert auth_mode(config) is mode
    line = describe_auth(config)
    assert line.startswith(f"auth: {mode.value} (")
    assert "sk-m" not in line
    assert "sk-org" not in line


def test_config_check_names_the_mode(tmp_path, capsys) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        """
backends:
  hosted: {api_base: "http://127.0.0.1:1/v1"}
  vllm: {api_base: "http://127.0.0.1:2/v1"}
models:
  - {model_name: m, hosted: m, vllm: m}
"""
    )
    main(["config", "check", "--config", str(path)], standalone_mode=False)
    out = capsys.readouterr().out
    assert "auth: pass_through (each client's key goes to the primary hosted" in out
    assert "verdicts kept 300 s" in out


def test_a_front_end_complaint_before_the_key_is_read_opens_nothing(bed_factory) -> None:
    """A 400 the primary's front end gives before it looks at a key (an oversized head, a
    malformed request) says nothing of the key: it neither unlocks the candidate for
    other keyless requests nor earns the request a shadow copy."""
    bed = bed_factory("{mode: split, percent: 50, noise_sample: 0}")
    sessions = (f"s-{i}" for i in range(40))
    key = [("Authorization", f"Bearer {GOOD_KEY}")]
    primary_bound = next(
        s
        for s in sessions
        if exchange(bed.proxy.url, [*key, ("X-Session-ID", s)])[1]["x-kvmigrate-backend"]
        == "hosted"
    )
    wait_for_copy(bed, primary_bound)
    bed.candidate_seen.clear()
    bed.primary.seen.clear()
    status, headers, _ = exchange(
        bed.proxy.url, [("X-Session-ID", primary_bound), ("X-Break", "1")]
    )
    assert status == 400
    assert headers["x-kvmigrate-backend"] == "hosted"
    answers = [chat(bed.proxy.url, None, session=f"other-{i}") for i in range(12)]
    assert {status for status, _ in answers} == {401}
    # A later request with an accepted key is shadowed: its copy marks that every earlier
    # copy was dispatched.
    assert chat(bed.proxy.url, GOOD_KEY, session=primary_bound)[0] == 200
    wait_for_copy(bed, primary_bound)
    time.sleep(0.2)
    assert len(bed.candidate_seen) == 1
    assert bed.candidate_seen[0].headers["X-Session-ID"] == primary_bound


def wait_for_copy(bed: Bed, session: str) -> None:
    """Until a copy of `session`'s request reached the candidate: it follows the answer."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(r.headers.get("X-Session-ID") == session for r in list(bed.candidate_seen)):
            return
        time.sleep(0.01)
    raise AssertionError(f"no copy of {session} reached the candidate")


def test_a_key_sent_twice_is_judged_as_the_primary_saw_it(bed_factory) -> None:
    """An empty Authorization before a good one: the primary is shown the good one, and the
    verdict is kept for the pair, not for the empty key every keyless client sends."""
    bed = bed_factory("{mode: split, percent: 100}")
    status, _, _ = exchange(
        bed.proxy.url, [("Authorization", ""), ("Authorization", f"Bearer {GOOD_KEY}")]
    )
    assert status == 200
    for headers in ([("Authorization", "")], []):
        status, _, body = exchange(bed.proxy.url, headers)
        assert status == 401
        assert json.loads(body)["error"]["message"].endswith("(primary's own words).")
    assert len(bed.candidate_seen) == 1


def test_a_keyless_client_cannot_tell_where_a_session_is_served(bed_factory) -> None:
    """Refused on its way to the candidate or by the primary itself, a keyless request gets
    the same status, the same body and the same headers (values that vary aside)."""
    bed = bed_factory("{mode: split, percent: 50, noise_sample: 0}")
    answers = {}
    for i in range(24):
        session = f"probe-{i}"
        status, headers, body = exchange(bed.proxy.url, [("X-Session-ID", session)])
        asked_primary_models = bed.primary.seen[-1].path == "/v1/models"
        answers[asked_primary_models] = (status, sorted(headers), body)
    assert set(answers) == {True, False}  # both kinds of session were tried
    assert answers[True] == answers[False]
    status, names, _ = answers[True]
    assert status == 401
    assert "x-kvmigrate-backend" in names
    assert "x-request-id" in names


def test_a_key_in_a_vendor_header_is_judged_by_that_header(bed_factory) -> None:
    """A primary behind an API management front end reads `Ocp-Apim-Subscription-Key`. The
    verdict on a client that sends it belongs to that header's value: its answers never
    open the candidate to clients that send no key at all."""
    # No copies of the primary's half: what reaches the candidate is what it serves.
    bed = bed_factory("{mode: split, percent: 50, noise_sample: 0, shadow_sample: 0}")
    apim = [("Ocp-Apim-Subscription-Key", APIM_KEY)]
    served = {exchange(bed.proxy.url, [*apim, ("X-Session-ID", f"L{i}")])[0] for i in range(12)}
    assert served == {200}  # on either backend: the primary's answers vouched for the key
    assert bed.candidate_seen
    for recorded in bed.candidate_seen:
        assert "ocp-apim-subscription-key" not in {k.lower() for k in recorded.headers}
    bed.candidate_seen.clear()
    answers = [chat(bed.proxy.url, None, session=f"L{i}") for i in range(12)]
    assert {status for status, _ in answers} == {401}
    time.sleep(0.2)
    assert bed.candidate_seen == []


def test_an_accepted_key_naming_another_project_is_asked_about_again(bed_factory) -> None:
    """The organisation and project headers decide what a key may do: a verdict on a key
    alone does not cover the same key naming a project it may not use."""
    bed = bed_factory("{mode: split, percent: 100}")
    key = [("Authorization", f"Bearer {GOOD_KEY}")]
    assert exchange(bed.proxy.url, key)[0] == 200
    status, _, body = exchange(bed.proxy.url, [*key, ("OpenAI-Project", "proj_B")])
    assert status == 401
    assert json.loads(body)["error"]["message"].endswith("(primary's own words).")
    assert exchange(bed.proxy.url, [*key, ("OpenAI-Project", OWN_PROJECT)])[0] == 200
    assert bed.primary.calls("GET", "/v1/models") == 3
    assert len(bed.candidate_seen) == 2


def test_the_check_carries_a_vendor_key_header(bed_factory) -> None:
    bed = bed_factory("{mode: split, percent: 100}")
    assert exchange(bed.proxy.url, [("Ocp-Apim-Subscription-Key", APIM_KEY)])[0] == 200
    (asked,) = [r for r in bed.primary.seen if r.path == "/v1/models"]
    assert {k.lower(): v for k, v in asked.headers.items()}["ocp-apim-subscription-key"] == APIM_KEY
    assert exchange(bed.proxy.url, [("Ocp-Apim-Subscription-Key", APIM_KEY + "x")])[0] == 401


def test_keyless_clients_of_an_open_primary_are_shadowed_once_it_says_it_is_open() -> None:
    """A primary that needs no key (an internal endpoint) serves clients that send none. Its
    answers vouch for nothing, but its model list asked without any credential says it is
    open to all: from then on such requests are shadowed as any other."""
    seen: list[Recorded] = []
    open_primary = EmulatorSettings(profile="hosted", time_scale=0)
    with (
        BackgroundServer(lambda: build_app(open_primary)) as hosted,
        BackgroundServer(lambda: recording_candidate(seen)) as candidate,
    ):
        config = proxy_config(hosted.url, candidate.url, "{mode: shadow, noise_sample: 0}")
        with BackgroundServer(lambda: build_proxy_app(config)) as proxy:
            assert chat(proxy.url, None, session="first")[0] == 200
            deadline = time.monotonic() + 30  # the question runs after the first answer
            while time.monotonic() < deadline:
                if chat(proxy.url, None, session="later")[0] == 200 and seen:
                    break
                time.sleep(0.05)
    assert {r.headers["X-Session-ID"] for r in seen} == {"later"}


def test_a_primary_admitting_by_a_header_the_proxy_cannot_read_opens_nothing(
    bed_factory,
) -> None:
    """The primary serves a client that names its tenant in a header no name gives away as
    a credential: the question without it is refused, so no request without a key is
    shadowed, and none reaches the candidate in a split."""
    bed = bed_factory("{mode: shadow, noise_sample: 0}")
    for i in range(5):
        status, _, _ = exchange(bed.proxy.url, [("X-Tenant", "t1"), ("X-Session-ID", f"t{i}")])
        assert status == 200
    deadline = time.monotonic() + 5
    while bed.primary.calls("GET", "/v1/models") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert bed.primary.calls("GET", "/v1/models") == 1  # asked once, refused, not kept
    withheld = 'kvmigrate_shadow_dropped_total{reason="key_unverified"} 5.0'
    assert withheld in urllib.request.urlopen(f"{bed.proxy.url}/metrics").read().decode()
    assert chat(bed.proxy.url, GOOD_KEY, session="marker")[0] == 200
    wait_for_copy(bed, "marker")
    time.sleep(0.2)
    assert [r.headers["X-Session-ID"] for r in bed.candidate_seen] == ["marker"]
