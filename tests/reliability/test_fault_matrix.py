"""The fault matrix: one cell per (rollout mode, fault), asserting what the client sees with
the official openai SDK and what the recorder writes.

- shadow mode: a failing candidate changes nothing for the client (same answer, no delay);
  its copy is recorded with the error class, paired with the answer it copies.
- split mode (100% to the candidate): a failure before the first byte falls back to the
  primary transparently (`x-kvmigrate-backend: hosted`, a `fallback_from` record); a failure
  after it ends the stream with an SSE error event that the SDK raises as `APIError`.

The proxy is `runtime.build_app` (what `kvmigrate proxy` serves) on a BackgroundServer, or
the real `kvmigrate proxy` process where a cell needs to act on the process (disk full).
Run with `-s` to see the table; set KVMIGRATE_REPORT_DIR to also get it as markdown.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import psutil  # type: ignore[import-untyped]
import pytest
from reliability_support import (
    HOSTED_MODEL,
    VLLM_MODEL,
    Cell,
    RedisServer,
    Row,
    describe,
    fetch_metrics,
    metric_sum,
    proxy_process,
    refused_port,
    render_markdown,
    render_text,
    rows_for,
    run_cli,
    wait_rows,
    wait_until,
)
from settling import counted, wait_settled

from kvmigrate.config import load_config
from kvmigrate.emulator import EmulatorSettings
from kvmigrate.emulator import build_app as build_emulator
from kvmigrate.proxy.app import SERVICE_KEY
from kvmigrate.rollout.live import LiveRollout
from kvmigrate.runtime import build_app
from kvmigrate.serving import BackgroundServer, free_port

pytestmark = pytest.mark.timeout(300)

# "slow" and "stalled" cells cost two seconds, not minutes; and a shadow copy they start is
# still running when the client has its answer (3-20 ms quiet, 100x less) however busy the
# machine.
CANDIDATE_READ_TIMEOUT = 2.0
# Copies that take the candidate's read timeout. That a shadow fault adds no delay is shown
# by the copy still being in flight when the client has its answer, not by comparing two
# latencies: under a CPU hog their noise reaches +-0.5 s, the read timeout itself. The table
# still prints the difference ("ms vs no fault") as a figure.
SLOW_CANDIDATE = ("candidate slow", "stalled stream")
CELLS: list[Cell] = []


@pytest.fixture(scope="module", autouse=True)
def matrix_report() -> Iterator[None]:
    yield
    if not CELLS:
        return
    print("\n\nFault matrix\n" + render_text(CELLS))
    report_dir = os.environ.get("KVMIGRATE_REPORT_DIR")
    if report_dir:
        path = Path(report_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "fault_matrix.md").write_text("# Fault matrix\n\n" + render_markdown(CELLS))


@dataclass
class Emulators:
    hosted: BackgroundServer
    vllm: BackgroundServer


@pytest.fixture(scope="module")
def emulators() -> Iterator[Emulators]:
    # The candidate is paced (time_scale 0.2: ~1.3 ms between tokens) so that a mid-stream
    # fault lands well after the first chunk the proxy reads; the primary is near-instant.
    hosted = BackgroundServer(
        lambda: build_emulator(EmulatorSettings(profile="hosted", time_scale=0.02))
    )
    vllm = BackgroundServer(
        lambda: build_emulator(EmulatorSettings(profile="vllm", time_scale=0.2))
    )
    with hosted, vllm:
        yield Emulators(hosted, vllm)


def rollout_yaml(mode: str, state: str) -> str:
    # noise_sample 0: a second primary call would add rows that depend on the session hash.
    if mode == "shadow":
        return f'{{mode: shadow, shadow_sample: 1.0, noise_sample: 0, state: "{state}"}}'
    return f'{{mode: split, percent: 100, fallback: true, noise_sample: 0, state: "{state}"}}'


def config_yaml(
    tmp: Path,
    hosted_url: str,
    vllm_url: str,
    mode: str,
    state: str | None = None,
    vllm_model: str = VLLM_MODEL,
    port: int = 4000,
) -> str:
    state = state or f"sqlite:///{tmp}/state.db"
    return f"""
server: {{host: 127.0.0.1, port: {port}}}
backends:
  hosted: {{api_base: "{hosted_url}/v1", read_timeout: 5, connect_timeout: 1}}
  vllm: {{api_base: "{vllm_url}/v1", read_timeout: {CANDIDATE_READ_TIMEOUT}, connect_timeout: 1,
          candidate_headers: [x-emulator-fault]}}
models:
  - {{model_name: {HOSTED_MODEL}, hosted: {HOSTED_MODEL}, vllm: "{vllm_model}"}}
rollout: {rollout_yaml(mode, state)}
record: {{db: "sqlite:///{tmp}/records.db", content: redacted}}
"""


@dataclass
class Seen:
    """What the client saw of one request."""

    backend: str | None = None
    request_id: str | None = None
    content: str = ""
    error: str | None = None
    error_code: str | None = None
    elapsed: float = 0.0

    def summary(self) -> str:
        if self.error is None:
            return f"200 from {self.backend}"
        after = " after first bytes" if self.content else ""
        return f"{self.error}({self.error_code}){after}"


MESSAGES: list[Any] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Read the failing test and propose a fix."},
]


def ask(client: openai.OpenAI, session: str, stream: bool, fault: str | None = None) -> Seen:
    """One chat request through the SDK. A seed makes the emulator's answer reproducible,
    so a shadow fault can be shown to leave the answer unchanged."""
    headers = {"X-Session-ID": session}
    if fault:
        headers["x-emulator-fault"] = fault
    kwargs: dict[str, Any] = {
        "model": HOSTED_MODEL,
        "messages": MESSAGES,
        "max_tokens": 12,
        "seed": 7,
        "extra_headers": headers,
    }
    seen = Seen()
    started = time.perf_counter()
    try:
        if stream:
            create = client.chat.completions.with_streaming_response.create
            with create(stream=True, **kwargs) as response:
                seen.backend = response.headers.get("x-kvmigrate-backend")
                seen.request_id = response.headers.get("x-request-id")
                for chunk in response.parse():
                    if chunk.choices and chunk.choices[0].delta.content:
                        seen.content += chunk.choices[0].delta.content
        else:
            raw = client.chat.completions.with_raw_response.create(**kwargs)
            seen.backend = raw.headers.get("x-kvmigrate-backend")
            seen.request_id = raw.headers.get("x-request-id")
            seen.content = raw.parse().choices[0].message.content or ""
    except openai.APIStatusError as exc:
        seen.error, seen.error_code = f"{type(exc).__name__} {exc.status_code}", exc.code
    except openai.APIError as exc:
        seen.error, seen.error_code = type(exc).__name__, exc.code
    seen.elapsed = time.perf_counter() - started
    return seen


@dataclass
class InProcessProxy:
    server: BackgroundServer
    db: Path
    client: openai.OpenAI
    config_path: Path

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def start_proxy(tmp_path: Path) -> Iterator[Any]:
    started: list[InProcessProxy] = []

    def start(text: str) -> InProcessProxy:
        path = tmp_path / "config.yaml"
        path.write_text(text)
        config = load_config(str(path))
        server = BackgroundServer(lambda: build_app(config, poll_interval=0.1)).start()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-client", max_retries=0)
        proxy = InProcessProxy(server, tmp_path / "records.db", client, path)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.client.close()
        proxy.server.stop()


# --- emulator faults on the candidate -------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What one request gets in split mode: `fallback` (the primary answers) or `sse_error`
    (bytes went out, then the SDK raises), and the candidate's recorded error class."""

    outcome: str
    error: str


def fallback(error: str) -> Expect:
    return Expect("fallback", error)


def sse_error(error: str) -> Expect:
    return Expect("sse_error", error)


@dataclass(frozen=True)
class Fault:
    name: str
    headers: tuple[str | None, str | None]  # x-emulator-fault, non-streamed and streamed
    split: tuple[Expect, Expect]
    shadow: tuple[str | None, str | None]  # the shadow copy's recorded error class
    candidate_down: bool = False


FAULTS = [
    Fault(
        "candidate down",
        (None, None),
        (fallback("unreachable"), fallback("unreachable")),
        ("unreachable", "unreachable"),
        candidate_down=True,
    ),
    Fault(
        "candidate slow",
        ("vllm:slow-first-byte=6",) * 2,
        (fallback("timeout"), fallback("timeout")),
        ("timeout", "timeout"),
    ),
    Fault(
        "candidate 5xx",
        ("vllm:503",) * 2,
        (fallback("http_503"), fallback("http_503")),
        ("http_503", "http_503"),
    ),
    Fault(
        "candidate 429",
        ("vllm:429",) * 2,
        (fallback("http_429"), fallback("http_429")),
        ("http_429", "http_429"),
    ),
    Fault(
        "garbage",
        ("vllm:malformed-json", "vllm:malformed-sse"),
        (fallback("malformed_body"), sse_error("malformed_stream")),
        ("malformed_body", "malformed_stream"),
    ),
    Fault(
        "redirect",
        ("vllm:redirect",) * 2,
        (fallback("unexpected_status"), fallback("unexpected_status")),
        ("unexpected_status", "unexpected_status"),
    ),
    Fault(
        # JSON to a request that asked to stream (the SDK finds no events in it), and an
        # event stream to one that did not.
        "wrong framing",
        ("vllm:wrong-framing",) * 2,
        (fallback("malformed_body"), fallback("malformed_stream")),
        ("malformed_body", "malformed_stream"),
    ),
    Fault(
        # Bytes with no line end: no SSE line ever completes, so only its start can tell.
        "no line ends",
        ("vllm:no-line-ends",) * 2,
        (fallback("malformed_body"), fallback("malformed_stream")),
        ("malformed_body", "malformed_stream"),
    ),
    Fault(
        "mid-stream disconnect",
        ("vllm:disconnect",) * 2,
        (fallback("unreachable"), sse_error("stream_broken")),
        ("stream_broken", "stream_broken"),
    ),
    Fault(
        "stalled stream",
        ("vllm:stall=6",) * 2,
        (fallback("timeout"), sse_error("stream_timeout")),
        ("stream_timeout", "stream_timeout"),
    ),
]


def by_role(rows: list[Row], role: str, backend: str | None = None) -> list[Row]:
    return [r for r in rows if r.role == role and (backend is None or r.backend == backend)]


def _shadow_params() -> list[Any]:
    return [pytest.param(f, id=f.name.replace(" ", "-")) for f in FAULTS]


@pytest.mark.slow
@pytest.mark.parametrize("fault", _shadow_params())
def test_shadow_mode_candidate_fault_changes_nothing_for_the_client(
    fault: Fault, emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    started = time.perf_counter()
    vllm_url = f"http://127.0.0.1:{refused_port()}" if fault.candidate_down else emulators.vllm.url
    proxy = start_proxy(config_yaml(tmp_path, emulators.hosted.url, vllm_url, "shadow"))
    client_text, recorded_text = [], []
    shadow_errors: list[str | None] = []
    for index, (stream, header) in enumerate(zip((False, True), fault.headers, strict=True)):
        kind = "streamed" if stream else "non-streamed"
        session = f"shadow-{fault.name}-{kind}"
        base = ask(proxy.client, session + "-baseline", stream)
        # The baseline's copy is done: only the fault's can be running. Two answers per round.
        wait_settled(proxy.url, answers=2 * index + 1)
        hit = ask(proxy.client, session, stream, header)
        # Read once the proxy has counted the hit, and so sent its copy: a streamed client
        # has its answer at `data: [DONE]`, before the proxy has read the upstream's end.
        in_flight = counted(proxy.url, answers=2 * index + 2)["kvmigrate_shadow_inflight"]
        if fault.name in SLOW_CANDIDATE:
            # The client had its whole answer while the copy was still waiting on the candidate.
            assert in_flight == 1, fault.name
        # The client: the primary's answer, the same as without the fault, no added delay.
        assert base.error is None, base
        assert base.content
        assert hit.error is None, hit
        assert hit.backend == "hosted"
        assert hit.content == base.content
        # The records: the answer, and the copy paired with it.
        rows = wait_rows(proxy.db, session, 2, proxy.url)
        serve, shadow = by_role(rows, "serve"), by_role(rows, "shadow")
        assert [(r.backend, r.status, r.error) for r in serve] == [("hosted", 200, None)]
        assert serve[0].request_id == hit.request_id
        assert [r.backend for r in shadow] == ["vllm"], rows
        assert shadow[0].pair_id == hit.request_id
        assert len(rows) == 2, rows
        shadow_errors.append(shadow[0].error)
        client_text.append(f"{kind}: {hit.summary()}, same answer, {(hit.elapsed - base.elapsed) * 1000:+.0f} ms vs no fault")  # fmt: skip
        recorded_text.append(f"{kind}: {describe(rows)}")
    CELLS.append(
        Cell("shadow", fault.name, "; ".join(client_text), " / ".join(recorded_text),
             time.perf_counter() - started)
    )  # fmt: skip
    if tuple(shadow_errors) != fault.shadow:
        CELLS[-1].recorded += f" [BUG: the copy's error class should be {fault.shadow}]"
    # Last, so that the table shows the cell even when this fails: the copy's error class.
    assert tuple(shadow_errors) == fault.shadow


@pytest.mark.parametrize(
    ("fault", "client_error", "copy_error"),
    [
        # vLLM's context window smaller than the hosted one: the primary answered, so the
        # refusal is the candidate's, and the gates must see it.
        ("vllm:400", None, "rejected"),
        ("vllm:422", None, "rejected"),
        ("vllm:404", None, "rejected"),  # an API's 404: not a route it does not serve
        # The request itself was bad: the candidate refusing it too is no evidence.
        ("hosted:400,vllm:400", "BadRequestError 400", "http_400"),
    ],
)
def test_a_shadow_copy_refused_with_a_4xx_counts_against_the_candidate_only_if_the_primary_answered(
    fault: str,
    client_error: str | None,
    copy_error: str,
    emulators: Emulators,
    start_proxy: Any,
    tmp_path: Path,
) -> None:
    proxy = start_proxy(config_yaml(tmp_path, emulators.hosted.url, emulators.vllm.url, "shadow"))
    # The primary has served the client's key once: a copy needs a key it vouched for.
    assert ask(proxy.client, f"key-{fault}", False).error is None
    for stream in (False, True):
        session = f"refused-{fault}-{stream}"
        hit = ask(proxy.client, session, stream, fault)
        assert hit.error == client_error, hit
        shadow = by_role(wait_rows(proxy.db, session, 2, proxy.url), "shadow")
        assert [(r.backend, r.error) for r in shadow] == [("vllm", copy_error)]


@pytest.mark.parametrize(
    ("fault", "client_error", "candidate_error"),
    [
        # vLLM's context window smaller than the hosted one: the client must not notice.
        ("vllm:400", None, "rejected"),
        ("vllm:422", None, "rejected"),
        # The candidate's own key refused: the client's key never goes there, so never its fault.
        ("vllm:401", None, "rejected"),
        # A 404 in vLLM's error envelope is the route refusing this request (a model or a
        # response id it does not hold), not a route it does not serve.
        ("vllm:404", None, "rejected"),
        # The request itself was bad: the primary's own error, and no evidence against vLLM.
        ("hosted:400,vllm:400", "BadRequestError 400", "http_400"),
    ],
)
def test_split_mode_a_candidates_refusal_falls_back_and_counts_only_if_the_primary_answered(
    fault: str,
    client_error: str | None,
    candidate_error: str,
    emulators: Emulators,
    start_proxy: Any,
    tmp_path: Path,
) -> None:
    proxy = start_proxy(config_yaml(tmp_path, emulators.hosted.url, emulators.vllm.url, "split"))
    for stream in (False, True):
        session = f"split-refused-{fault}-{stream}"
        hit = ask(proxy.client, session, stream, fault)
        assert hit.error == client_error, hit
        if client_error is None:
            assert (hit.backend, bool(hit.content)) == ("hosted", True), hit
        rows = wait_rows(proxy.db, session, 2, proxy.url)
        assert [(r.role, r.backend, r.error, r.fallback_from) for r in rows] == [
            ("serve", "vllm", candidate_error, None),
            ("serve", "hosted", client_error and "http_400", "vllm"),
        ], rows


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS, ids=[f.name.replace(" ", "-") for f in FAULTS])
def test_split_mode_candidate_fault_falls_back_or_ends_the_stream_cleanly(
    fault: Fault, emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    started = time.perf_counter()
    vllm_url = f"http://127.0.0.1:{refused_port()}" if fault.candidate_down else emulators.vllm.url
    proxy = start_proxy(config_yaml(tmp_path, emulators.hosted.url, vllm_url, "split"))
    if not fault.candidate_down:
        healthy = ask(proxy.client, f"split-{fault.name}-healthy", False)
        assert (healthy.error, healthy.backend) == (None, "vllm"), healthy
    client_text, recorded_text = [], []
    for stream, header, expect in zip((False, True), fault.headers, fault.split, strict=True):
        kind = "streamed" if stream else "non-streamed"
        session = f"split-{fault.name}-{kind}"
        hit = ask(proxy.client, session, stream, header)
        if expect.outcome == "fallback":
            # Before the first byte: the primary answers and the client cannot tell.
            assert hit.error is None, hit
            assert hit.backend == "hosted"
            assert hit.content
            rows = wait_rows(proxy.db, session, 2, proxy.url)
            assert [(r.role, r.backend, r.error, r.fallback_from) for r in rows] == [
                ("serve", "vllm", expect.error, None),
                ("serve", "hosted", None, "vllm"),
            ], rows
            assert rows[1].request_id == hit.request_id
            assert rows[1].status == 200
        else:
            # After bytes went out: a clean SSE error event, raised by the SDK.
            assert hit.error == "APIError", hit
            assert hit.error_code == expect.error
            assert hit.backend == "vllm"
            assert hit.content, "the error must come after the first tokens"
            rows = wait_rows(proxy.db, session, 1, proxy.url)
            assert [(r.role, r.backend, r.error, r.fallback_from) for r in rows] == [
                ("serve", "vllm", expect.error, None)
            ], rows
        client_text.append(f"{kind}: {hit.summary()}")
        recorded_text.append(f"{kind}: {describe(rows)}")
    CELLS.append(
        Cell("split", fault.name, "; ".join(client_text), " / ".join(recorded_text),
             time.perf_counter() - started)
    )  # fmt: skip


# --- the primary down ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["shadow", "split"])
def test_primary_down(mode: str, emulators: Emulators, start_proxy: Any, tmp_path: Path) -> None:
    started = time.perf_counter()
    hosted_url = f"http://127.0.0.1:{refused_port()}"
    config = config_yaml(tmp_path, hosted_url, emulators.vllm.url, mode)
    if mode == "split":
        # The proxy checks keys itself: with the client's key passed through, a key the
        # down primary never vouched for cannot reach the candidate (the last test here).
        config = with_master_key(config)
    proxy = start_proxy(config)
    client_text, recorded_text = [], []
    for stream in (False, True):
        kind = "streamed" if stream else "non-streamed"
        session = f"{mode}-primary-down-{kind}"
        if mode == "shadow":
            # Nobody can answer in the primary's place: a clean 502 envelope, never a hang.
            hit = ask(proxy.client, session, stream)
            assert hit.error == "InternalServerError 502", hit
            assert hit.error_code == "upstream_unreachable"
            rows = wait_rows(proxy.db, session, 1, proxy.url)
            assert [(r.backend, r.error) for r in by_role(rows, "serve")] == [
                ("hosted", "unreachable")
            ]
            # No copy of a request the primary failed: an SDK retries it, and each retry
            # would be shadowed again (`rollout.shadow_primary_failures: true` shadows them).
            assert by_role(rows, "shadow") == []
        else:
            # The candidate serves: the client never notices the primary is gone ...
            ok = ask(proxy.client, session + "-ok", stream)
            assert (ok.error, ok.backend) == (None, "vllm"), ok
            # ... until the candidate fails too: then a clean 502, both attempts recorded.
            hit = ask(proxy.client, session, stream, "vllm:503")
            assert hit.error == "InternalServerError 502", hit
            assert hit.error_code == "upstream_unreachable"
            rows = wait_rows(proxy.db, session, 2, proxy.url)
            assert [(r.backend, r.error, r.fallback_from) for r in rows] == [
                ("vllm", "http_503", None),
                ("hosted", "unreachable", "vllm"),
            ], rows
            client_text.append(f"{kind}: 200 from vllm; with vllm:503 too")
        client_text.append(f"{kind}: {hit.summary()}")
        recorded_text.append(f"{kind}: {describe(rows)}")
    CELLS.append(
        Cell(mode, "primary down", "; ".join(client_text), " / ".join(recorded_text),
             time.perf_counter() - started)
    )  # fmt: skip


def test_primary_down_shadowed_on_request(
    emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    hosted_url = f"http://127.0.0.1:{refused_port()}"
    config = config_yaml(tmp_path, hosted_url, emulators.vllm.url, "shadow").replace(
        "noise_sample: 0,", "noise_sample: 0, shadow_primary_failures: true,"
    )
    proxy = start_proxy(with_master_key(config))
    for stream in (False, True):
        session = f"shadowed-primary-down-{stream}"
        hit = ask(proxy.client, session, stream)
        assert hit.error == "InternalServerError 502", hit
        rows = wait_rows(proxy.db, session, 2, proxy.url)
        assert [(r.backend, r.error) for r in by_role(rows, "serve")] == [("hosted", "unreachable")]
        # Asked for: the copy still goes out, and the candidate's answer is evidence too.
        assert [(r.backend, r.error) for r in by_role(rows, "shadow")] == [("vllm", None)]


@pytest.mark.parametrize("mode", ["shadow, shadow_primary_failures: true", "split"])
def test_primary_down_keeps_the_candidate_closed_to_unchecked_keys(
    mode: str, emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    """With the client's key passed through, only the primary can vouch for it: while it is
    down a new key is served by nobody and copied nowhere (a 503 that says why)."""
    hosted_url = f"http://127.0.0.1:{refused_port()}"
    config = config_yaml(tmp_path, hosted_url, emulators.vllm.url, mode.split(",")[0])
    if extra := mode.partition(",")[2]:
        config = config.replace("noise_sample: 0,", f"noise_sample: 0,{extra},")
    proxy = start_proxy(config)
    session = f"unchecked-{mode[:5]}"
    hit = ask(proxy.client, session, False)
    if mode == "split":
        assert hit.error == "InternalServerError 503", hit
        assert hit.error_code == "key_verification_unavailable"
        wait_settled(proxy.url)
        assert rows_for(proxy.db, session) == []  # refused before any backend was called
    else:
        assert hit.error == "InternalServerError 502", hit
        rows = wait_rows(proxy.db, session, 1, proxy.url)
        assert [(r.backend, r.role, r.error) for r in rows] == [("hosted", "serve", "unreachable")]
    vllm = metric_sum(fetch_metrics(proxy.url), "kvmigrate_requests_total", backend="vllm")
    assert vllm == 0


def with_master_key(config: str) -> str:
    """The config with the proxy checking keys itself (the key the tests' clients send)."""
    return config.replace("server: {host:", "server: {master_key: sk-client, host:", 1)


# --- Redis down ----------------------------------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["shadow", "split"])
def test_redis_down_keeps_serving_on_the_last_state(
    mode: str, emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    started = time.perf_counter()
    redis = RedisServer(tmp_path / "redis").start()
    try:
        # The config seeds the other mode; the state the proxies must keep is the one the
        # CLI wrote to Redis, so falling back to the config would show.
        seed = "split" if mode == "shadow" else "shadow"
        text = config_yaml(tmp_path, emulators.hosted.url, emulators.vllm.url, seed, redis.url)
        proxy = start_proxy(text)
        change = ["--mode", "shadow"] if mode == "shadow" else ["--percent", "100", "--force"]
        done = run_cli("rollout", *change, "--reason", "matrix", "--config", str(proxy.config_path))
        assert done.returncode == 0, done.stderr
        split = 1.0 if mode == "split" else 0.0
        wait_until(
            lambda: metric_sum(fetch_metrics(proxy.url), "kvmigrate_rollout_split") == split,
            5,
            "the proxy to apply the change",
        )
        redis.stop()
        live = proxy.server.app[SERVICE_KEY].rollout
        assert isinstance(live, LiveRollout)
        failed_before = live.store_errors
        # Several failed polls of the store (the proxy's own count), not a fixed sleep.
        wait_until(lambda: live.store_errors >= failed_before + 3, 30, "failed polls of the store")
        served = "vllm" if mode == "split" else "hosted"
        client_text, recorded_text = [], []
        for stream in (False, True):
            kind = "streamed" if stream else "non-streamed"
            session = f"{mode}-redis-down-{kind}"
            hit = ask(proxy.client, session, stream)
            assert (hit.error, hit.backend) == (None, served), hit
            # Redis keyed the session; its secret is in the proxy's memory once Redis is down.
            identity = proxy.server.app[SERVICE_KEY].identity
            grouped_as = identity.in_store(session)
            assert identity.store is not None
            key = identity.store.keys.records_key()  # what the recorder hashes with
            count = 2 if mode == "shadow" else 1
            rows = wait_rows(
                proxy.db, session, count, proxy.url, grouped_as=grouped_as, hash_key=key
            )
            assert [r.role for r in rows] == (
                ["serve", "shadow"] if mode == "shadow" else ["serve"]
            )
            client_text.append(f"{kind}: {hit.summary()}")
            recorded_text.append(f"{kind}: {describe(rows)}")
        # A change while the store is down: a clear one-line error, a non-zero exit.
        failed = run_cli("rollout", "--mode", seed, "--config", str(proxy.config_path))
        assert failed.returncode != 0
        assert "Traceback" not in failed.stderr + failed.stdout
        assert failed.stderr.startswith("Error: "), failed.stderr
        assert "Redis" in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
        # Still serving on the last state after the failed change.
        again = ask(proxy.client, f"{mode}-redis-down-after", False)
        assert (again.error, again.backend) == (None, served)
        client_text.append(f"CLI change: exit {failed.returncode}, `{failed.stderr.strip()[:90]}`")
    finally:
        redis.stop()
    CELLS.append(
        Cell(mode, "Redis down", "; ".join(client_text), " / ".join(recorded_text),
             time.perf_counter() - started)
    )  # fmt: skip


# --- disk full for the recorder --------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.solo  # it waits on the recorder's lowest-priority workers to meet the full disk
@pytest.mark.parametrize("mode", ["shadow", "split"])
def test_disk_full_recorder_drops_and_counts_the_proxy_keeps_answering(
    mode: str, emulators: Emulators, tmp_path: Path
) -> None:
    """The disk is "full" through RLIMIT_FSIZE on the proxy process (tests run as root, so a
    read-only directory would not stop SQLite, and no tmpfs can be mounted): every write to
    a regular file fails with EFBIG, as writes to a full disk fail with ENOSPC. Python
    ignores SIGXFSZ, so the process sees errors, not a signal."""
    started = time.perf_counter()
    port = free_port()
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(tmp_path, emulators.hosted.url, emulators.vllm.url, mode, port=port))  # fmt: skip
    db = tmp_path / "records.db"
    per_request = 2 if mode == "shadow" else 1  # records per answered request
    served = "hosted" if mode == "shadow" else "vllm"
    proxy = proxy_process(config, port, tmp_path / "proxy.log", pipe=True).start()
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-client", max_retries=0)
    try:

        def settled(expected_written: int) -> bool:
            metrics = fetch_metrics(proxy.url)
            return bool(
                metric_sum(metrics, "kvmigrate_records_written_total") >= expected_written
                and metric_sum(metrics, "kvmigrate_recorder_queue_depth") == 0
                and metric_sum(metrics, "kvmigrate_shadow_inflight") == 0
            )

        for i in range(2):
            assert ask(client, f"{mode}-disk-before-{i}", i == 1).error is None
        wait_until(lambda: settled(2 * per_request), 30, "records before the disk fills")
        # The writer is idle (every exchange written): no batch straddles the change.
        wait_settled(proxy.url)
        # The whole pod's disk is full: the proxy and its processes (the recorder's worker
        # writes the records).
        process = psutil.Process(proxy.pid)
        processes = [process, *process.children(recursive=True)]
        assert len(processes) > 1
        soft, hard = process.rlimit(psutil.RLIMIT_FSIZE)
        for each in processes:
            each.rlimit(psutil.RLIMIT_FSIZE, (0, hard))
        outage = 6
        for i in range(outage):
            hit = ask(client, f"{mode}-disk-full-{i}", i % 2 == 1)
            assert (hit.error, hit.backend) == (None, served), hit
        expected_drops = outage * per_request
        metrics = wait_until(
            lambda: (
                (m := fetch_metrics(proxy.url))
                and metric_sum(m, "kvmigrate_records_dropped_total", reason="write_error")
                >= expected_drops
                and m
            ),
            30,  # as the other waits here: the recorder's worker runs at idle priority
            "the dropped records to be counted",
        )
        dropped = metric_sum(metrics, "kvmigrate_records_dropped_total", reason="write_error")
        errors = metric_sum(metrics, "kvmigrate_recorder_write_errors_total")
        assert dropped == expected_drops
        assert errors >= 1
        assert proxy.alive()
        # Space is back: the writer reopens the database and records again.
        for each in processes:
            each.rlimit(psutil.RLIMIT_FSIZE, (soft, hard))
        for i in range(2):
            hit = ask(client, f"{mode}-disk-after-{i}", i == 1)
            assert hit.error is None
        for i in range(2):
            wait_rows(db, f"{mode}-disk-after-{i}", per_request, proxy.url)
        lost = [rows_for(db, f"{mode}-disk-full-{i}") for i in range(outage)]
        assert not any(lost), "records written while the disk was full?"
    finally:
        client.close()
        code = proxy.stop()
    output = proxy.output()
    assert code == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "recorder: writing records failed" in output
    CELLS.append(
        Cell(
            mode,
            "disk full (recorder)",
            f"{outage}/{outage} answered by {served} while the disk was full",
            f"{dropped:.0f} records dropped (reason=write_error), {errors:.0f} failed batch "
            f"writes, 0 rows written; after space came back: recorded again, no traceback",
            time.perf_counter() - started,
        )
    )


# --- a real vLLM, killed -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_split_real_vllm_killed_falls_back_transparently(
    emulators: Emulators, start_proxy: Any, tmp_path: Path
) -> None:
    from kvmigrate.testbed.tiny_model import ensure_tiny_model
    from kvmigrate.testbed.vllm_server import VllmServer
    from kvmigrate.testbed.vllm_venv import ensure_vllm_venv

    python = ensure_vllm_venv()
    model = ensure_tiny_model("tiny", python)
    with VllmServer(model, served_model_name="tiny", python=python) as vllm:
        started = time.perf_counter()
        text = config_yaml(
            tmp_path, emulators.hosted.url, vllm.root_url, "split", vllm_model="tiny"
        ).replace(f"read_timeout: {CANDIDATE_READ_TIMEOUT}", "read_timeout: 30")
        proxy = start_proxy(text)
        first = ask(proxy.client, "vllm-kill-before", True)
        assert (first.error, first.backend) == (None, "vllm"), first
        # SIGKILL the whole group (API server, engine core, worker): no graceful anything.
        server_pid = next(
            p.pid
            for p in psutil.Process().children(recursive=True)
            if str(vllm.port) in " ".join(p.cmdline())
        )
        os.killpg(os.getpgid(server_pid), signal.SIGKILL)
        wait_until(lambda: not vllm.is_running(), 10, "vLLM to die")
        client_text, recorded_text = [f"before: {first.summary()}"], []
        for stream in (False, True):
            kind = "streamed" if stream else "non-streamed"
            session = f"vllm-killed-{kind}"
            hit = ask(proxy.client, session, stream)
            assert (hit.error, hit.backend) == (None, "hosted"), hit
            assert hit.content
            rows = wait_rows(proxy.db, session, 2, proxy.url)
            assert [(r.backend, r.error, r.fallback_from) for r in rows] == [
                ("vllm", "unreachable", None),
                ("hosted", None, "vllm"),
            ], rows
            client_text.append(f"after kill, {kind}: {hit.summary()}")
            recorded_text.append(f"{kind}: {describe(rows)}")
    CELLS.append(
        Cell("split", "real vLLM SIGKILLed", "; ".join(client_text), " / ".join(recorded_text),
             time.perf_counter() - started)
    )  # fmt: skip
