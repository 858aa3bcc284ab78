"""`proxy/forward.py` row by row, continued (test_forward_relay.py says how): the
candidate's malformed lines and refusals, shadow copies, timeouts before and after the
first byte, clients that leave, the proxy stopping, pass-through routes and the buffer
limit."""

from __future__ import annotations

import pytest
from forward_bed import (
    BUFFER_LIMIT,
    CANDIDATE_MODEL,
    DONE,
    JSON,
    REFUSAL_KEPT,
    SPLIT,
    SSE,
    Proxy,
    Reply,
    Step,
    Upstream,
    new_token,
    proxy_config,
    running,
)
from forward_client import (
    Raw,
    anthropic_error_event,
    chat,
    check_clock,
    check_volatile,
    completion,
    error_body,
    event,
    message_event,
    messages,
    openai_error_event,
    post,
    read_answer,
    relayed,
    rewritten,
)

from kvmigrate.exchange import Exchange
from kvmigrate.proxy import forward


def test_a_candidates_stream_names_the_model_the_client_asked_for(
    patient: None, split: Proxy, upstream: Upstream
) -> None:
    token = new_token("rewrite")
    parts = [event("Hel", CANDIDATE_MODEL), event("lo", CANDIDATE_MODEL) + DONE]
    steps: list[Step] = [("head",), ("write", parts[0]), ("gate", f"{token}/1")]
    upstream.script(token, "candidate", Reply([*steps, ("write", parts[1])], headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, model="both"))
    head = raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    assert head.headers == relayed(SSE, backend="vllm", served=CANDIDATE_MODEL)
    assert ([seen, *rest], complete) == ([rewritten(p, "both") for p in parts], True)
    exchange = split.records.of(token, "vllm")
    assert (exchange.error, list(exchange.chunks)) == (None, parts)  # the backend's own bytes
    check_clock(exchange)


@pytest.mark.parametrize("route", ["chat/completions", "messages"])
def test_a_candidates_malformed_line_ends_its_stream_with_an_error_event(
    split: Proxy, upstream: Upstream, route: str
) -> None:
    token = new_token("malformed")
    message = "The backend sent a malformed stream event."
    bad = b"data: {not json\n\n"
    if route == "messages":
        first, body = message_event("Hel"), messages(token, model="both")
        last = anthropic_error_event(message)
    else:
        first, body = event("Hel", CANDIDATE_MODEL), chat(token, model="both")
        last = openai_error_event(message, "malformed_stream")
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1"), ("write", bad)]
    upstream.script(token, "candidate", Reply([*steps, ("stall",)], headers=SSE))
    raw = Raw(split)
    raw.send("POST", f"/v1/{route}", body)
    raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    assert ([seen, *rest], complete) == ([rewritten(first, "both"), last], True)
    exchange = split.records.of(token, "vllm")
    assert (exchange.error, list(exchange.chunks)) == ("malformed_stream", [first, bad])


def test_a_candidates_malformed_line_after_a_held_end_goes_out_after_that_end(
    patient: None, split: Proxy, upstream: Upstream
) -> None:
    token = new_token("held-malformed")
    first, bad = event("Hi", CANDIDATE_MODEL) + DONE, b"data: {not json\n\n"
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/head")]
    upstream.script(token, "candidate", Reply([*steps, ("write", bad), ("stall",)], headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, model="both"))
    raw.head()
    assert raw.buf == b""
    upstream.gate(f"{token}/head").set()
    rest, complete = raw.rest()
    raw.close()
    last = openai_error_event("The backend sent a malformed stream event.", "malformed_stream")
    assert (rest, complete) == ([rewritten(first, "both") + last], True)
    exchange = split.records.of(token, "vllm")
    assert (exchange.error, list(exchange.chunks)) == ("malformed_stream", [first, bad])


def test_a_candidates_last_line_left_open_and_malformed_ends_with_an_error_event(
    split: Proxy, upstream: Upstream
) -> None:
    token = new_token("open-line")
    first, unfinished = event("Hel", CANDIDATE_MODEL), b'data: {"unfinished'
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1")]
    upstream.script(token, "candidate", Reply([*steps, ("write", unfinished)], headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, model="both"))
    raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    last = openai_error_event("The backend sent a malformed stream event.", "malformed_stream")
    assert ([seen, *rest], complete) == ([rewritten(first, "both"), unfinished, last], True)
    exchange = split.records.of(token, "vllm")
    assert (exchange.error, list(exchange.chunks)) == ("malformed_stream", [first, unfinished])


@pytest.mark.parametrize("answer", ["malformed first event", "JSON to a stream", "bad JSON"])
def test_a_candidate_failing_before_its_first_byte_with_no_fallback_is_a_502(
    split: Proxy, upstream: Upstream, answer: str
) -> None:
    token = new_token("no-fallback")
    stream, kind = True, "malformed_stream"
    if answer == "malformed first event":
        reply = Reply([("head",), ("write", b"data: {nope\n\n"), ("stall",)], headers=SSE)
    elif answer == "JSON to a stream":
        reply = Reply([("respond", completion("Hi", CANDIDATE_MODEL))], headers=JSON)
    else:
        stream, kind = False, "malformed_body"
        reply = Reply([("respond", b'{"id": ')], headers=JSON)
    upstream.script(token, "candidate", reply)
    answer_ = post(split, chat(token, model="llama-only", stream=stream))
    assert answer_.head.status == 502
    message = f"Backend `vllm` failed ({kind})."
    assert answer_.body == error_body(message, "upstream_error")
    assert split.records.of(token, "vllm").error == kind


def test_a_candidates_refusal_falls_back_and_keeps_its_reason(
    split: Proxy, upstream: Upstream
) -> None:
    token = new_token("refusal")
    refusal = error_body("This model's maximum context length is 8192 tokens.", "too_long")
    upstream.script(token, "candidate", Reply([("respond", refusal)], status=400, headers=JSON))
    body = completion("From the primary.")
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    answer = post(split, chat(token, model="both", stream=False))
    assert answer.head.status == 200
    assert answer.head.headers["x-kvmigrate-backend"] == "hosted"
    assert answer.body == body.replace(b'"model":"gpt-4o-mini"', b'"model":"both"')
    refused, served = split.records.of(token, "vllm"), split.records.of(token, "hosted")
    assert (refused.status, refused.error, refused.body()) == (400, "rejected", refusal)
    assert (served.status, served.error, served.fallback_from) == (200, None, "vllm")


@pytest.mark.parametrize("sent", ["in small pieces", "64 KiB at once, then more"])
def test_a_long_refusal_is_kept_up_to_64_kib(split: Proxy, upstream: Upstream, sent: str) -> None:
    """Read up to 64 KiB and no further: every read but the last ends under the bound."""
    token = new_token("long-refusal")
    refusal = b'{"error":{"message":"' + b"x" * (160 * 1024) + b'"}}'
    steps: list[Step] = [("head",)]
    if sent == "in small pieces":  # each read is likely one piece, far under the bound
        steps.append(("pieces", refusal, 16 * 1024, 0.01))
    else:
        steps += [("write", refusal[:REFUSAL_KEPT]), ("sleep", 0.05)]
        steps.append(("write", refusal[REFUSAL_KEPT:]))
    upstream.script(token, "candidate", Reply(steps, status=400, headers=JSON))
    body = completion("From the primary.")
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    answer = post(split, chat(token, model="both", stream=False))
    assert answer.head.headers["x-kvmigrate-backend"] == "hosted"
    refused = split.records.of(token, "vllm")
    kept = list(refused.chunks)
    assert kept
    assert refusal.startswith(b"".join(kept))
    assert sum(len(chunk) for chunk in kept[:-1]) < REFUSAL_KEPT
    assert (refused.status, refused.error) == (400, "rejected")


def test_a_refusal_whose_body_never_ends_is_waited_for_a_moment_only(
    split: Proxy, upstream: Upstream
) -> None:
    """Its reason is read for a quarter second at most, then the primary answers."""
    token = new_token("endless-refusal")
    start = b'{"error":{"message":"'
    steps: list[Step] = [("head",), ("write", start), ("trickle", b" ", 0.02)]
    upstream.script(token, "candidate", Reply(steps, status=400, headers=JSON))
    body = completion("From the primary.")
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    answer = post(split, chat(token, model="both", stream=False))
    assert (answer.head.status, answer.head.headers["x-kvmigrate-backend"]) == (200, "hosted")
    refused = split.records.of(token, "vllm")
    kept = refused.body()
    assert kept.startswith(start)
    assert kept == start + b" " * (len(kept) - len(start))
    assert (refused.status, refused.error) == (400, "rejected")


def test_a_candidate_that_hangs_up_falls_back_to_the_primary(
    split: Proxy, upstream: Upstream
) -> None:
    token = new_token("candidate-hangup")
    upstream.script(token, "candidate", Reply([("close",)]))
    body = completion("From the primary.")
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    answer = post(split, chat(token, model="both", stream=False))
    assert (answer.head.status, answer.head.headers["x-kvmigrate-backend"]) == (200, "hosted")
    assert split.records.of(token, "vllm").error == "unreachable"
    assert split.records.of(token, "hosted").fallback_from == "vllm"


COPY_HEADERS = {**JSON, "Connection": "close"}  # no idle connection: each copy is a task


def serve_and_copy(shadow: Proxy, upstream: Upstream, token: str, copy: Reply) -> Exchange:
    """The primary answers at once, the candidate's copy as `copy` says; the copy's record."""
    upstream.script(token, "primary", Reply([("respond", completion("Served."))], headers=JSON))
    upstream.script(token, "candidate", copy)
    answer = post(shadow, chat(token, model="both", stream=False))
    assert answer.head.status == 200
    served = shadow.records.of(token, "hosted")
    return shadow.records.one(lambda x: x.role == "shadow" and x.pair_id == served.request_id)


def test_a_shadow_copy_is_drained_and_timed(shadow: Proxy, upstream: Upstream) -> None:
    token = new_token("copy")
    body = completion("Copied.", CANDIDATE_MODEL)
    parts = [body[:30], body[30:60], body[60:]]
    steps: list[Step] = [("head",), ("write", parts[0]), ("sleep", 0.02), ("write", parts[1])]
    steps += [("sleep", 0.02), ("write", parts[2])]
    copy = serve_and_copy(shadow, upstream, token, Reply(steps, headers=COPY_HEADERS))
    assert (copy.backend, copy.status, copy.error, copy.body()) == ("vllm", 200, None, body)
    check_clock(copy)


def test_a_shadow_copy_that_breaks_is_recorded_broken(shadow: Proxy, upstream: Upstream) -> None:
    token = new_token("copy-broken")
    first = b'{"id":"chatcmpl-1",'
    steps: list[Step] = [("head",), ("write", first), ("close",)]
    copy = serve_and_copy(shadow, upstream, token, Reply(steps, headers=COPY_HEADERS))
    assert (copy.status, copy.error, list(copy.chunks)) == (200, "stream_broken", [first])
    check_clock(copy)


def test_a_shadow_copy_without_a_body_has_no_first_byte(shadow: Proxy, upstream: Upstream) -> None:
    token = new_token("copy-empty")
    reply = Reply([("respond", b"")], headers=COPY_HEADERS)
    copy = serve_and_copy(shadow, upstream, token, reply)
    assert (copy.status, list(copy.chunks), copy.first_byte, copy.last_chunk) == (
        200,
        [],
        None,
        None,
    )
    assert (copy.later_chunks, copy.max_chunk_gap) == (0, 0.0)
    assert copy.finished is not None
    assert copy.finished >= copy.started


def test_a_shadow_copy_that_stalls_is_a_stream_timeout(shadow: Proxy, upstream: Upstream) -> None:
    token = new_token("copy-stall")
    first = b'{"id":"chatcmpl-1",'
    steps: list[Step] = [("head",), ("write", first), ("stall",)]
    copy = serve_and_copy(shadow, upstream, token, Reply(steps, headers=COPY_HEADERS))
    assert (copy.status, copy.error, list(copy.chunks)) == (200, "stream_timeout", [first])
    check_clock(copy)


TOO_LATE = error_body("Backend `hosted` did not answer in time.", "upstream_timeout")


def test_no_head_in_time_is_a_504(impatient: Proxy, upstream: Upstream) -> None:
    """After an answer that leaves its connection idle, so the call goes out before it is
    routed (`answer_of`) and its timeout is mapped there."""
    warm = new_token("warm")
    upstream.script(warm, "primary", Reply([("respond", completion("Hi"))], headers=JSON))
    assert post(impatient, chat(warm, stream=False)).head.status == 200
    token = new_token("no-head")
    upstream.script(token, "primary", Reply([("stall",)]))
    answer = post(impatient, chat(token, stream=False))
    assert (answer.head.status, answer.body) == (504, TOO_LATE)
    exchange = impatient.records.of(token, "hosted")
    assert (exchange.status, exchange.error) == (None, "timeout")


def test_a_head_without_a_body_in_time_is_a_504_and_frees_its_connection(
    no_collector: None, impatient: Proxy, upstream: Upstream
) -> None:
    """The primary takes one connection at a time here: the next call gets it back."""
    token = new_token("no-body")
    upstream.script(token, "primary", Reply([("head",), ("stall",)], headers=SSE))
    answer = post(impatient, chat(token))
    assert (answer.head.status, answer.body) == (504, TOO_LATE)
    exchange = impatient.records.of(token, "hosted")
    assert (exchange.status, exchange.error) == (200, "timeout")
    after = new_token("after")
    upstream.script(after, "primary", Reply([("respond", completion("Hi"))], headers=JSON))
    assert post(impatient, chat(after, stream=False)).head.status == 200


def test_a_stream_that_stalls_after_its_first_bytes_ends_with_a_timeout_event(
    impatient: Proxy, upstream: Upstream
) -> None:
    token = new_token("stall")
    first = event("Hel")
    upstream.script(token, "primary", Reply([("head",), ("write", first), ("stall",)], headers=SSE))
    answer = post(impatient, chat(token))
    last = openai_error_event("The backend stream broke off (stream_timeout).", "stream_timeout")
    assert (answer.frames, answer.complete) == ([first, last], True)
    exchange = impatient.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks)) == ("stream_timeout", [first])


def leave_after_the_first_chunk(proxy: Proxy, upstream: Upstream, token: str) -> None:
    """Read the head and first chunk, hang up, and let the upstream go on once the proxy
    has seen the client go."""
    proxy.wait_alone()
    raw = Raw(proxy)
    raw.send("POST", "/v1/chat/completions", chat(token))
    raw.head()
    raw.frame()
    raw.close()
    proxy.wait_alone()
    upstream.gate(f"{token}/1").set()


def test_a_client_that_leaves_mid_stream_is_recorded_as_gone(
    lonely: Proxy, upstream: Upstream
) -> None:
    token = new_token("leaves")
    first, second = event("Hel"), event("lo")
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1"), ("write", second)]
    upstream.script(token, "primary", Reply([*steps, ("stall",)], headers=SSE))
    leave_after_the_first_chunk(lonely, upstream, token)
    exchange = lonely.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks)) == ("client_disconnected", [first, second])
    check_clock(exchange)


def test_a_client_that_leaves_before_the_held_end_is_recorded_as_gone(
    patient: None, lonely: Proxy, upstream: Upstream
) -> None:
    token = new_token("leaves-held")
    first = event("Hel")
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1"), ("write", DONE)]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    leave_after_the_first_chunk(lonely, upstream, token)
    exchange = lonely.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks)) == ("client_disconnected", [first, DONE])


def test_a_stream_that_breaks_after_its_client_left_is_recorded_broken(
    lonely: Proxy, upstream: Upstream
) -> None:
    token = new_token("leaves-broken")
    first = event("Hel")
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    leave_after_the_first_chunk(lonely, upstream, token)
    exchange = lonely.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks)) == ("stream_broken", [first])


@pytest.mark.parametrize("held", [False, True])
def test_a_stream_the_proxy_stops_ends_with_an_error_event(
    monkeypatch: pytest.MonkeyPatch, upstream: Upstream, held: bool
) -> None:
    monkeypatch.setattr(forward, "END_GRACE_S", 60.0)  # see `patient`
    token = new_token("shutdown")
    first = event("Hel") + (DONE if held else b"")
    upstream.script(token, "primary", Reply([("head",), ("write", first), ("stall",)], headers=SSE))
    with running(proxy_config(upstream, SPLIT)) as proxy:
        raw = Raw(proxy)
        raw.send("POST", "/v1/chat/completions", chat(token))
        raw.head()
        if held:
            assert raw.buf == b""
            seen = []
        else:
            seen = [raw.frame() or b""]
        proxy.end_now()
        rest, complete = raw.rest()
        raw.close()
        exchange = proxy.records.of(token, "hosted")
    last = openai_error_event("The proxy shut down before the answer ended.", "proxy_shutdown")
    if held:
        assert [*seen, *rest] == [first + last]
    else:
        assert [*seen, *rest] == [first, last]
    assert not complete
    assert exchange.error == "proxy_shutdown"


OCTETS = {"Content-Type": "application/octet-stream"}


def test_a_pass_through_stream_is_relayed_and_recorded(split: Proxy, upstream: Upstream) -> None:
    token = new_token("file")
    parts = [b"line one\n", b"line two\n"]
    steps: list[Step] = [("head",), ("write", parts[0]), ("gate", f"{token}/1")]
    upstream.script(token, "primary", Reply([*steps, ("write", parts[1])], headers=OCTETS))
    raw = Raw(split)
    raw.send("GET", f"/v1/files/{token}/content")
    head = raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    assert head.headers == relayed(OCTETS, served=None)
    assert ([seen, *rest], complete) == (parts, True)
    exchange = split.records.by_id(head.volatile["x-request-id"])
    check_volatile(head, exchange, model_route=False)
    assert (exchange.route, exchange.status, exchange.error) == ("other", 200, None)
    assert list(exchange.chunks) == parts
    check_clock(exchange)


def test_a_pass_through_whole_body_is_recorded_with_its_time(
    split: Proxy, upstream: Upstream
) -> None:
    token = new_token("file-whole")
    body = b'{"id":"file-1","object":"file"}'
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    raw = Raw(split)
    raw.send("GET", f"/v1/files/{token}")
    answer = read_answer(raw)
    raw.close()
    assert answer.body == body
    exchange = split.records.by_id(answer.head.volatile["x-request-id"])
    assert exchange.body() == body
    assert exchange.first_byte is not None
    assert exchange.first_byte == exchange.finished


def test_an_answer_without_a_body_is_relayed_as_a_head(split: Proxy, upstream: Upstream) -> None:
    """A 204 has neither a body nor a Content-Type."""
    token = new_token("deleted")
    upstream.script(token, "primary", Reply([("respond", None)], status=204))
    raw = Raw(split)
    raw.send("DELETE", f"/v1/files/{token}")
    answer = read_answer(raw)
    raw.close()
    assert answer.head.status == 204
    assert answer.head.headers == {"x-kvmigrate-backend": "hosted", "connection": "close"}
    assert (answer.frames, answer.trailing) == ([], b"")
    exchange = split.records.by_id(answer.head.volatile["x-request-id"])
    assert (exchange.status, list(exchange.chunks), exchange.later_chunks) == (204, [], 0)
    assert exchange.first_byte is not None
    assert exchange.last_chunk == exchange.first_byte
    assert exchange.finished is not None
    assert exchange.finished >= exchange.first_byte


@pytest.mark.parametrize("over", [False, True])
def test_a_body_over_the_buffer_limit_is_streamed(
    split: Proxy, upstream: Upstream, over: bool
) -> None:
    """Up to 8 MiB an answer is read whole and sent with its length; over it, streamed:
    the client has its first bytes before the upstream sends the rest."""
    token = new_token("large")
    size = BUFFER_LIMIT + 1 if over else BUFFER_LIMIT
    body = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    if over:
        steps: list[Step] = [("head",), ("write", body[: 1 << 20]), ("gate", f"{token}/1")]
        reply = Reply([*steps, ("write", body[1 << 20 :])], headers=OCTETS, length=size)
    else:
        reply = Reply([("respond", body)], headers=OCTETS)
    upstream.script(token, "primary", reply)
    raw = Raw(split)
    raw.send("GET", f"/v1/files/{token}/content")
    head = raw.head()
    if over:
        assert head.headers == relayed(OCTETS, served=None)
        seen = raw.frame() or b""
        upstream.gate(f"{token}/1").set()
        rest, complete = raw.rest()
        assert (seen + b"".join(rest), complete) == (body, True)
    else:
        framing = ("content-length", str(BUFFER_LIMIT))
        assert head.headers == relayed(OCTETS, served=None, framing=framing)
        assert raw.whole(BUFFER_LIMIT) == body
    raw.close()
