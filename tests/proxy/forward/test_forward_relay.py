"""`proxy/forward.py`, the relay, row by row: what a client sees of each way a backend can
answer (a whole body, an event stream, its `data: [DONE]` early, late or never followed by
the end, a break or a stall before or after the first byte, a candidate's malformed line or
refusal, a shadow copy nobody reads) and what the proxy hands its addons for the records
and the Prometheus histograms (`Exchange`: status, error, bytes, and the decode clock's
first_byte / last_chunk / later_chunks / max_chunk_gap / finished).

One scripted upstream on loopback serves every backend of every proxy: a test registers how
it answers (a list of steps) under a token it puts in the request (the last message's
content, or a pass-through path's last segment) and for the backend that will be asked
(primary or candidate, told apart by the model the body names). Gates let a row run the
upstream in lockstep with what the client has read, so which bytes arrive together is
known without reading a clock; no row bounds a wait from above, and every wait gives up
after DEADLINE_S. The clients are a raw socket (every byte of the head and of each chunk as
framed) and the official openai SDK.

This file: a whole answer, an event stream and its end, a stream that breaks. The
candidate, shadow copies, timeouts, clients that leave and the proxy stopping are in
test_forward_failures.py."""

from __future__ import annotations

import time

import openai
import pytest
from forward_bed import (
    DONE,
    DONE_CRLF,
    JSON,
    PRIMARY_MODEL,
    SSE,
    Proxy,
    Reply,
    Step,
    Upstream,
    new_token,
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
    relayed,
    sdk,
)


def test_a_whole_json_answer_is_relayed_with_its_headers(split: Proxy, upstream: Upstream) -> None:
    token = new_token("whole")
    body = completion("Prefix caching reuses the KV cache.")
    headers = {**JSON, "x-request-id": "up-7", "x-upstream-note": "kept"}
    upstream.script(token, "primary", Reply([("respond", body)], headers=headers))
    request = chat(token, stream=False)
    answer = post(split, request)
    exchange = split.records.of(token, "hosted")
    assert answer.head.status == 200
    assert answer.head.headers == relayed(
        {**JSON, "x-upstream-note": "kept", "x-kvmigrate-upstream-request-id": "up-7"},
        framing=("content-length", str(len(body))),
    )
    check_volatile(answer.head, exchange)
    assert (answer.body, answer.complete, answer.trailing) == (body, True, b"")
    assert upstream.bodies(token, "primary") == [request]  # byte for byte
    assert (exchange.status, exchange.error, exchange.body()) == (200, None, body)
    # Arrived whole: its first byte is its last, and no decode was timed.
    assert exchange.first_byte is not None
    assert exchange.first_byte == exchange.finished
    assert (exchange.last_chunk, exchange.later_chunks, exchange.max_chunk_gap) == (None, 0, 0.0)


def test_a_whole_answer_reads_in_the_sdk(split: Proxy, upstream: Upstream) -> None:
    token = new_token("sdk-whole")
    body = completion("It reuses the cache.")
    upstream.script(token, "primary", Reply([("respond", body)], headers=JSON))
    with sdk(split) as client:
        answer = client.chat.completions.create(
            model=PRIMARY_MODEL, messages=[{"role": "user", "content": token}]
        )
    assert answer.choices[0].message.content == "It reuses the cache."


def test_an_event_stream_with_a_length_is_still_relayed_as_a_stream(
    split: Proxy, upstream: Upstream
) -> None:
    token = new_token("sse-length")
    body = event("All ") + event("at once.") + DONE
    upstream.script(token, "primary", Reply([("respond", body)], headers=SSE))
    answer = post(split, chat(token))
    assert answer.head.headers == relayed(SSE)
    assert (answer.body, answer.complete) == (body, True)
    assert split.records.of(token, "hosted").body() == body


def test_a_whole_body_cut_short_is_a_502(split: Proxy, upstream: Upstream) -> None:
    token = new_token("cut-whole")
    steps: list[Step] = [("head",), ("write", b'{"id":"chatcmpl-1",'), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=JSON, length=200))
    answer = post(split, chat(token, stream=False))
    assert answer.head.status == 502
    assert answer.head.headers["content-type"] == "application/json"
    message = "Backend `hosted` could not be reached."
    assert answer.body == error_body(message, "upstream_unreachable")
    assert split.records.of(token, "hosted").error == "unreachable"


def test_an_event_stream_is_relayed_chunk_by_chunk(
    patient: None, split: Proxy, upstream: Upstream
) -> None:
    """Each chunk reaches the client before the upstream sends the next one."""
    token = new_token("lockstep")
    parts = [event("Pre"), event("fix "), event("caching.") + DONE]
    steps: list[Step] = [("head",), ("write", parts[0]), ("gate", f"{token}/1")]
    steps += [("write", parts[1]), ("gate", f"{token}/2"), ("write", parts[2])]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token))
    head = raw.head()
    seen = []
    for k in (1, 2):
        seen.append(raw.frame())
        if k == 1:  # a first gap longer than the last: the clock keeps the longest
            time.sleep(0.05)
        upstream.gate(f"{token}/{k}").set()
    frames, complete = raw.rest()
    raw.close()
    exchange = split.records.of(token, "hosted")
    assert (head.status, head.headers) == (200, relayed(SSE))
    check_volatile(head, exchange)
    assert ([*seen, *frames], complete) == (parts, True)
    assert (exchange.status, exchange.error, list(exchange.chunks)) == (200, None, parts)
    assert exchange.later_chunks == 2
    check_clock(exchange)


def done_layout(name: str, token: str) -> tuple[list[Step], list[bytes], list[bytes]]:
    """Where `data: [DONE]` comes: the upstream's steps, the chunks the client gets, and
    the chunks the proxy read. A layout whose first chunk ends the stream has the client
    see the head alone (`{token}/head`); the others wait for its first chunk (`/1`)."""
    lf, crlf = event("Hi"), event("Hi", end=b"\r\n\r\n")
    more, more_crlf = event(" there"), event(" there", end=b"\r\n\r\n")
    comment = b": the upstream's last word\n\n"
    head: list[Step] = [("head",)]
    layouts = {
        "first": ([("write", lf + DONE), ("gate", f"{token}/head")], [lf + DONE], [lf + DONE]),
        "first, CRLF": (
            [("write", crlf + DONE_CRLF), ("gate", f"{token}/head")],
            [crlf + DONE_CRLF],
            [crlf + DONE_CRLF],
        ),
        "later": (
            [("write", lf), ("gate", f"{token}/1"), ("write", more + DONE)],
            [lf, more + DONE],
            [lf, more + DONE],
        ),
        "later, CRLF": (
            [("write", crlf), ("gate", f"{token}/1"), ("write", more_crlf + DONE_CRLF)],
            [crlf, more_crlf + DONE_CRLF],
            [crlf, more_crlf + DONE_CRLF],
        ),
        "alone": ([("write", lf), ("gate", f"{token}/1"), ("write", DONE)], [lf, DONE], [lf, DONE]),
        # A held end that was not the end after all goes out with what followed it.
        "then more": (
            [("write", lf + DONE), ("gate", f"{token}/head"), ("write", comment)],
            [lf + DONE + comment],
            [lf + DONE, comment],
        ),
    }
    steps, frames, chunks = layouts[name]
    return head + steps, frames, chunks


@pytest.mark.parametrize(
    "layout", ["first", "first, CRLF", "later", "later, CRLF", "alone", "then more"]
)
def test_the_last_event_goes_out_with_the_upstreams_end(
    patient: None, split: Proxy, upstream: Upstream, layout: str
) -> None:
    token = new_token("done")
    steps, frames, chunks = done_layout(layout, token)
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token))
    head = raw.head()
    seen: list[bytes] = []
    if layout.startswith("first") or layout == "then more":
        # Held for the upstream's end: nothing of the body came with the head.
        assert raw.buf == b""
        upstream.gate(f"{token}/head").set()
    else:
        seen.append(raw.frame() or b"")
        upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    exchange = split.records.of(token, "hosted")
    assert head.headers == relayed(SSE)
    assert ([*seen, *rest], complete) == (frames, True)
    assert (exchange.error, list(exchange.chunks)) == (None, chunks)
    check_clock(exchange)


@pytest.mark.parametrize("layout", ["first", "later"])
def test_an_upstream_that_never_ends_does_not_keep_the_end_from_the_client(
    split: Proxy, upstream: Upstream, layout: str
) -> None:
    """The held `data: [DONE]` goes out END_GRACE_S later on its own: the client has the
    whole stream while the upstream still holds its body open."""
    token = new_token("never-ends")
    hi, there = event("Hi"), event(" there")
    steps: list[Step] = [("head",)]
    if layout == "first":
        steps += [("write", hi + DONE)]
        expected = [hi + DONE]
    else:
        steps += [("write", hi), ("gate", f"{token}/1"), ("write", there + DONE)]
        expected = [hi, there + DONE]
    steps += [("gate", f"{token}/release"), ("set", f"{token}/ended")]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token))
    raw.head()
    seen: list[bytes] = []
    if layout == "later":
        seen.append(raw.frame() or b"")
        upstream.gate(f"{token}/1").set()
    seen += raw.frames_until(DONE)
    assert seen == expected
    assert not upstream.gate(f"{token}/ended").is_set()
    upstream.gate(f"{token}/release").set()
    rest, complete = raw.rest()
    raw.close()
    assert (rest, complete) == ([], True)
    exchange = split.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks)) == (None, expected)
    check_clock(exchange)


@pytest.mark.parametrize("route", ["chat/completions", "messages"])
def test_a_stream_broken_after_its_first_bytes_ends_with_an_error_event(
    split: Proxy, upstream: Upstream, route: str
) -> None:
    token = new_token("broken")
    message = "The backend stream broke off (stream_broken)."
    if route == "messages":
        first, body = message_event("Hel"), messages(token)
        last = anthropic_error_event(message)
    else:
        first, body = event("Hel"), chat(token)
        last = openai_error_event(message, "stream_broken")
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/1"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    raw = Raw(split)
    raw.send("POST", f"/v1/{route}", body)
    head = raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    assert head.headers == relayed(SSE)
    assert ([seen, *rest], complete) == ([first, last], True)
    exchange = split.records.of(token, "hosted")
    assert (exchange.status, exchange.error, list(exchange.chunks)) == (
        200,
        "stream_broken",
        [first],
    )
    check_clock(exchange)


def test_a_broken_stream_is_an_error_in_the_sdk(split: Proxy, upstream: Upstream) -> None:
    token = new_token("sdk-broken")
    steps: list[Step] = [("head",), ("write", event("Hel")), ("gate", f"{token}/1"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    texts: list[str | None] = []
    with sdk(split) as client:
        stream = client.chat.completions.create(
            model=PRIMARY_MODEL, messages=[{"role": "user", "content": token}], stream=True
        )

        def read() -> None:
            for part in stream:
                texts.append(part.choices[0].delta.content)
                upstream.gate(f"{token}/1").set()

        with pytest.raises(openai.APIError) as raised:
            read()
    assert texts == ["Hel"]
    assert raised.value.message == "The backend stream broke off (stream_broken)."


def test_a_held_end_goes_out_before_the_error_event(
    patient: None, split: Proxy, upstream: Upstream
) -> None:
    token = new_token("held-broken")
    first = event("Hi") + DONE
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/head"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=SSE))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token))
    raw.head()
    assert raw.buf == b""
    upstream.gate(f"{token}/head").set()
    rest, complete = raw.rest()
    raw.close()
    broke = openai_error_event("The backend stream broke off (stream_broken).", "stream_broken")
    assert (rest, complete) == ([first + broke], True)
    assert split.records.of(token, "hosted").error == "stream_broken"


def test_a_body_without_length_broken_resets_the_connection(
    split: Proxy, upstream: Upstream
) -> None:
    """No event can say a JSON body broke: the client's connection is reset instead, never
    ended cleanly as a 200 with half a document (a keep-alive client would wait on it)."""
    token = new_token("broken-json")
    part = b'{"id":"chatcmpl-1","choices":['
    steps: list[Step] = [("head",), ("write", part), ("gate", f"{token}/1"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers=JSON))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, stream=False), close=False)
    head = raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    # The connection is reset before the relay returns, so before the exchange is recorded:
    # from then on the reset is in this socket already. A proxy that only left it open
    # would hold a keep-alive client until some other timeout closed it.
    exchange = split.records.of(token, "hosted")
    raw.sock.settimeout(5.0)  # loopback delivery only; not the machine's speed
    rest, complete = raw.rest()
    trailing = raw.trailing()
    raw.close()
    keep_alive = relayed(JSON)
    del keep_alive["connection"]
    assert (head.status, head.headers) == (200, keep_alive)
    assert (seen, rest, complete, trailing) == (part, [], False, b"")
    assert (exchange.error, list(exchange.chunks)) == ("stream_broken", [part])


def test_a_body_without_length_broken_after_what_looks_like_an_end_is_still_a_break(
    patient: None, split: Proxy, upstream: Upstream
) -> None:
    """A plain body whose chunk happens to end as an event stream's last event is held like
    one; a break then resets the client all the same, recorded as the backend's break."""
    token = new_token("broken-plain")
    first = b"a plain text answer that ends like a stream\n" + DONE
    steps: list[Step] = [("head",), ("write", first), ("gate", f"{token}/head"), ("close",)]
    upstream.script(token, "primary", Reply(steps, headers={"Content-Type": "text/plain"}))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, stream=False), close=False)
    head = raw.head()
    assert raw.buf == b""
    upstream.gate(f"{token}/head").set()
    exchange = split.records.of(token, "hosted")  # reset before it was recorded, as above
    raw.sock.settimeout(5.0)
    rest, complete = raw.rest()
    raw.close()
    assert (head.status, rest, complete) == (200, [], False)
    assert (exchange.error, list(exchange.chunks)) == ("stream_broken", [first])


def test_a_body_without_length_is_relayed_chunk_by_chunk(split: Proxy, upstream: Upstream) -> None:
    token = new_token("chunked-json")
    body = completion("In two parts.")
    parts = [body[:20], body[20:]]
    steps: list[Step] = [("head",), ("write", parts[0]), ("gate", f"{token}/1")]
    upstream.script(token, "primary", Reply([*steps, ("write", parts[1])], headers=JSON))
    raw = Raw(split)
    raw.send("POST", "/v1/chat/completions", chat(token, stream=False))
    head = raw.head()
    seen = raw.frame()
    upstream.gate(f"{token}/1").set()
    rest, complete = raw.rest()
    raw.close()
    assert head.headers == relayed(JSON)
    assert ([seen, *rest], complete) == (parts, True)
    exchange = split.records.of(token, "hosted")
    assert (exchange.error, list(exchange.chunks), exchange.later_chunks) == (None, parts, 1)
    check_clock(exchange)


@pytest.mark.parametrize("model", [PRIMARY_MODEL, "llama-only"])
def test_a_backend_that_hangs_up_before_answering_is_a_502(
    split: Proxy, upstream: Upstream, model: str
) -> None:
    token = new_token("hangup")
    backend, who = ("hosted", "primary") if model == PRIMARY_MODEL else ("vllm", "candidate")
    upstream.script(token, who, Reply([("close",)]))
    answer = post(split, chat(token, model=model, stream=False))
    assert answer.head.status == 502
    message = f"Backend `{backend}` could not be reached."
    assert answer.body == error_body(message, "upstream_unreachable")
    assert split.records.of(token, backend).error == "unreachable"
