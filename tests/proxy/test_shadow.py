"""Shadow mode: the primary answers, and nothing the candidate does can touch the client."""

from __future__ import annotations

import json
import socketserver
import threading
import time

import openai
import pytest
from proxy_support import (
    CHAT_COMPLETION,
    FAULTS_ALLOWED,
    HOSTED_MODEL,
    Backends,
    ProxyFactory,
    RunningProxy,
    proxy_config,
)
from settling import counted

from kvmigrate.exchange import Exchange
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer
from kvmigrate.wire.chunk_log import MAX_RECORDED_BYTES

CANDIDATE_FAULTS = [
    "vllm:500",
    "vllm:429",
    "vllm:hang",
    "vllm:disconnect",
    "vllm:malformed-json",
    "vllm:malformed-sse",
    "vllm:stall",
    "vllm:slow-first-byte=3",
]


def ask(proxy: RunningProxy, fault: str, stream: bool, seed: int = 11) -> tuple[str, float]:
    client = proxy.client()
    messages = [{"role": "user", "content": "Summarise the incident report in two lines."}]
    start = time.perf_counter()
    headers = {"x-emulator-fault": fault} if fault else {}
    if stream:
        chunks = client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, stream=True, seed=seed, extra_headers=headers
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        completion = client.chat.completions.create(
            model=HOSTED_MODEL, messages=messages, seed=seed, extra_headers=headers
        )
        text = completion.choices[0].message.content or ""
    return text, time.perf_counter() - start


def wait_metric(
    proxy: RunningProxy, name: str, minimum: float, timeout: float = 10.0, **labels: str
) -> float:
    deadline = time.monotonic() + timeout
    value = proxy.metric(name, **labels)
    while value < minimum and time.monotonic() < deadline:
        time.sleep(0.05)
        value = proxy.metric(name, **labels)
    return value


# Faults that keep the candidate busy for seconds (the candidate's read_timeout is 2 s).
SLOW_FAULTS = {"vllm:hang", "vllm:stall", "vllm:slow-first-byte=3"}
# The client's whole call takes 3-18 ms on a quiet machine: 1.8 s is a 100x margin (1.11 s
# was seen beside a CPU hog), and still under the 2 s a client that waited for a hung
# candidate would wait. The proof that it did not wait is the copy still in flight.
NO_DELAY_BOUND_S = 1.8


def settled_copies(proxy: RunningProxy, answers: int = 0, timeout: float = 10.0) -> float:
    """The shadow copies counted once the proxy has counted `answers` answers (and so sent
    their copies: a streamed client stops at `data: [DONE]`, before the proxy has) and none
    is in flight. A copy is counted before it leaves the in-flight gauge."""
    counted(proxy.url, answers)
    deadline = time.monotonic() + timeout
    while proxy.metric("kvmigrate_shadow_inflight") != 0:
        assert time.monotonic() < deadline, "shadow copies still in flight"
        time.sleep(0.05)
    return proxy.metric("kvmigrate_requests_total", role="shadow")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("fault", CANDIDATE_FAULTS)
def test_failing_candidate_has_no_effect_on_the_client(
    make_proxy: ProxyFactory, fault: str, stream: bool
) -> None:
    proxy = make_proxy(rollout="{mode: shadow, shadow_sample: 1.0}", vllm_extra=FAULTS_ALLOWED)
    baseline, _ = ask(proxy, "", stream)
    assert settled_copies(proxy, answers=1) == 1
    answer, elapsed = ask(proxy, fault, stream)
    in_flight = counted(proxy.url, answers=2)["kvmigrate_shadow_inflight"]
    assert answer == baseline  # same seed, same primary: the candidate changed nothing
    if fault in SLOW_FAULTS:
        # The client had its whole answer while the candidate's copy was still running.
        assert in_flight == 1
        assert elapsed < NO_DELAY_BOUND_S
    # The copy really went out: one shadow exchange for each of the two requests.
    assert wait_metric(proxy, "kvmigrate_requests_total", 2, role="shadow") == 2
    assert settled_copies(proxy, answers=2) == 2


def test_streamed_shadow_is_consumed_to_the_end(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(rollout="{mode: shadow, shadow_sample: 1.0}")
    client = proxy.client()
    stream = client.chat.completions.create(
        model=HOSTED_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    assert list(stream)
    assert (
        wait_metric(
            proxy, "kvmigrate_request_duration_seconds_count", 1, backend="vllm", role="shadow"
        )
        == 1
    )
    assert proxy.metric("kvmigrate_ttft_seconds_count", backend="vllm", role="shadow") == 1
    # Usage from the final chunk of the shadow stream was parsed.
    assert proxy.metric("kvmigrate_tokens_total", backend="vllm", role="shadow", kind="prompt") > 0


def test_shadow_copies_beyond_the_bound_are_dropped_and_counted(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(
        rollout="{mode: shadow, shadow_sample: 1.0, shadow_max_concurrency: 2}",
        vllm_extra=FAULTS_ALLOWED,
    )
    for _ in range(5):
        ask(proxy, "vllm:hang", stream=False)
    # The fifth copy is refused just after its answer: poll, then check nothing more came.
    dropped = wait_metric(proxy, "kvmigrate_shadow_dropped_total", 3, reason="concurrency_limit")
    assert dropped == 3
    assert proxy.metric("kvmigrate_shadow_inflight") == 2


def test_shadow_copies_past_the_byte_budget_are_dropped_and_counted(
    make_proxy: ProxyFactory,
) -> None:
    """Copies a hanging candidate holds count against `shadow_max_bytes` by their bodies
    (here about 1.3 KB each, so two fit in 3,000 bytes); a body is let go with its copy."""
    proxy = make_proxy(
        rollout="{mode: shadow, shadow_sample: 1.0, noise_sample: 0, shadow_max_bytes: 3000}",
        vllm_extra=FAULTS_ALLOWED,
    )
    client = proxy.client()
    note = [{"role": "user", "content": "incident report " * 75}]

    def send(fault: str) -> None:
        client.chat.completions.create(
            model=HOSTED_MODEL, messages=note, extra_headers={"x-emulator-fault": fault}
        )

    for _ in range(5):
        send("vllm:hang")
    dropped = wait_metric(proxy, "kvmigrate_shadow_dropped_total", 3, reason="bytes_limit")
    assert dropped == 3
    assert proxy.metric("kvmigrate_shadow_inflight") == 2
    assert proxy.metric("kvmigrate_shadow_dropped_total", reason="concurrency_limit") == 0
    # The candidate's read timeout (2 s) ends the two: their bytes are free again.
    deadline = time.monotonic() + 30
    while proxy.metric("kvmigrate_shadow_inflight") > 0:
        assert time.monotonic() < deadline, "the hanging copies never ended"
        time.sleep(0.05)
    send("")
    shadows = wait_metric(
        proxy, "kvmigrate_request_duration_seconds_count", 3, backend="vllm", role="shadow"
    )
    assert shadows == 3  # the two that timed out, and this one
    assert proxy.metric("kvmigrate_shadow_dropped_total", reason="bytes_limit") == 3


def test_shadow_sample_picks_whole_conversations(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(rollout="{mode: shadow, shadow_sample: 0.5}")
    client = proxy.client()
    shadowed = []
    for conversation in range(16):
        before = settled_copies(proxy)
        messages = [{"role": "user", "content": f"task {conversation}"}]
        for _turn in range(3):
            answer = client.chat.completions.create(model=HOSTED_MODEL, messages=messages)
            messages += [
                answer.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "go on"},
            ]
        shadowed.append(settled_copies(proxy) - before)
    assert set(shadowed) <= {0.0, 3.0}, "a conversation was shadowed for only some turns"
    assert 0 < shadowed.count(3.0) < 16


@pytest.mark.parametrize(
    ("primary_fault", "shadowed"),
    [
        ("hosted:503", False),  # an SDK retries these: the retry brings its own copy
        ("hosted:500", False),
        ("hosted:429", False),
        ("hosted:400", True),  # the client's own fault: still worth comparing
        ("", True),
    ],
)
def test_no_shadow_copy_for_an_answer_the_primary_failed(
    make_proxy: ProxyFactory, primary_fault: str, shadowed: bool
) -> None:
    proxy = make_proxy(rollout="{mode: shadow, shadow_sample: 1.0, noise_sample: 0}")
    client = proxy.client()
    # The client's key is passed through: the primary has served it once, so its copies go
    # out (a key the primary never accepted gets none, whatever the answer).
    client.chat.completions.create(model=HOSTED_MODEL, messages=[{"role": "user", "content": "a"}])
    headers = {"x-emulator-fault": primary_fault} if primary_fault else {}
    try:
        client.chat.completions.create(
            model=HOSTED_MODEL, messages=[{"role": "user", "content": "hi"}], extra_headers=headers
        )
    except openai.APIStatusError:
        assert primary_fault
    # A later, healthy request's copy is the marker that every earlier copy was dispatched.
    client.chat.completions.create(model=HOSTED_MODEL, messages=[{"role": "user", "content": "ok"}])
    expected = 3 if shadowed else 2
    assert wait_metric(proxy, "kvmigrate_requests_total", expected, role="shadow") == expected
    assert settled_copies(proxy) == expected  # and no copy that should not exist


class ScriptedCandidate(socketserver.ThreadingTCPServer):
    """A candidate written against the socket, for answers no emulator gives."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, handler: type[socketserver.StreamRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.answered = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def read_call(handler: socketserver.StreamRequestHandler) -> bool:
    """Read one call's head and body; False at the end of the connection."""
    length = 0
    while (line := handler.rfile.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if line == b"":
        return False
    handler.rfile.read(length)
    return True


class DropsKeptAliveConnections(ScriptedCandidate):
    """A candidate that answers the first call on each connection and closes the connection
    on the next one unanswered, as a server does with a keep-alive connection it timed out
    just as the proxy reused it."""

    def __init__(self) -> None:
        super().__init__(_AnswerOncePerConnection)
        self.connections = 0


class _AnswerOncePerConnection(socketserver.StreamRequestHandler):
    server: DropsKeptAliveConnections

    def handle(self) -> None:
        self.server.connections += 1
        for call in range(2):
            if not read_call(self) or call == 1:
                return  # the second call: closed unanswered
            body = json.dumps(CHAT_COMPLETION).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            self.wfile.write(head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            self.server.answered += 1


def test_a_copy_whose_kept_alive_connection_was_dropped_goes_again(
    make_proxy: ProxyFactory,
) -> None:
    """Every copy after the first is sent on the connection the one before left idle, which
    the candidate drops unanswered: each goes once more on a new connection, and every copy
    is recorded as answered, none as a failure."""
    candidate = DropsKeptAliveConnections()
    threading.Thread(target=candidate.serve_forever, daemon=True).start()
    try:
        proxy = make_proxy(
            rollout="{mode: shadow, shadow_sample: 1.0, noise_sample: 0}", vllm_url=candidate.url
        )
        for seed in range(3):
            ask(proxy, "", stream=False, seed=seed)
            assert settled_copies(proxy) == seed + 1
        assert proxy.metric("kvmigrate_requests_total", role="shadow", status="200") == 3
        assert proxy.metric("kvmigrate_errors_total", role="shadow") == 0
        assert (candidate.answered, candidate.connections) == (3, 3)
    finally:
        candidate.shutdown()
        candidate.server_close()


class AnswersHugeAfterTheFirst(ScriptedCandidate):
    """A candidate gone wrong: its first answer is a normal one (so a kept-alive connection
    waits idle for the next copy), every later one is `huge` bytes long."""

    def __init__(self, huge: int) -> None:
        super().__init__(_AnswerHugeAfterTheFirst)
        self.huge = huge


class _AnswerHugeAfterTheFirst(socketserver.StreamRequestHandler):
    server: AnswersHugeAfterTheFirst

    def handle(self) -> None:
        while read_call(self):
            first = self.server.answered == 0
            self.server.answered += 1
            size = len(json.dumps(CHAT_COMPLETION)) if first else self.server.huge
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            self.wfile.write(head + b"Content-Length: %d\r\n\r\n" % size)
            if first:
                self.wfile.write(json.dumps(CHAT_COMPLETION).encode())
                continue
            block = b" " * (1 << 20)
            for _ in range(size >> 20):
                self.wfile.write(block)


class Exchanges:
    """An addon that keeps every exchange the proxy reports."""

    def __init__(self) -> None:
        self.seen: list[Exchange] = []

    def exchange_done(self, exchange: Exchange) -> None:
        self.seen.append(exchange)


def test_a_candidate_answer_far_over_the_record_cap_is_not_kept_whole(
    backends: Backends,
) -> None:
    """A copy sent on an idle connection is collected by its answer's callbacks, which never
    pause reading: a candidate that answers 48 MB must not have all of it held by the proxy
    (256 such copies would be 12 GB). The copy keeps the head and the tail the recorder
    keeps of any answer, and counts the rest."""
    huge = 6 * MAX_RECORDED_BYTES
    candidate = AnswersHugeAfterTheFirst(huge)
    threading.Thread(target=candidate.serve_forever, daemon=True).start()
    exchanges = Exchanges()
    config = proxy_config(
        backends.hosted.url, candidate.url, "{mode: shadow, shadow_sample: 1.0, noise_sample: 0}"
    )
    server = BackgroundServer(lambda: build_proxy_app(config, addons=[exchanges])).start()
    proxy = RunningProxy(server, config)
    try:
        for seed in range(2):
            text, _ = ask(proxy, "", stream=False, seed=seed)
            assert text
            assert settled_copies(proxy, answers=seed + 1) == seed + 1
        copies = [e for e in exchanges.seen if e.role == "shadow"]
        assert [c.status for c in copies] == [200, 200]
        kept = sum(map(len, copies[1].chunks))
        assert kept <= MAX_RECORDED_BYTES + 9 * (1 << 20)
        assert kept + copies[1].chunks.dropped == huge
        assert candidate.answered == 2
    finally:
        server.stop()
        candidate.shutdown()
        candidate.server_close()
