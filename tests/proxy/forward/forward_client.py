"""The forward table's clients and bodies: a raw socket that reads every byte of the head
and each chunk as the proxy framed it, the SDK, and what the backends send."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import orjson
from forward_bed import CANDIDATE_MODEL, DEADLINE_S, KEY, PRIMARY_MODEL, Proxy

from kvmigrate.exchange import Exchange


class Cut(Exception):
    """The connection ended inside a body."""


@dataclass
class Head:
    status: int
    headers: dict[str, str]  # lower-case names; the volatile ones are in `volatile`
    volatile: dict[str, str]


# Different at every answer: checked for their shape, not their value.
VOLATILE = ("date", "x-request-id", "x-kvmigrate-overhead-ms")


class Raw:
    """One request on its own connection, and its answer read as it arrives: the head,
    then the body chunk by chunk as the proxy framed it."""

    def __init__(self, proxy: Proxy) -> None:
        host, port = proxy.url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
        self.buf = bytearray()
        self.eof = False

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        close: bool = True,
        headers: tuple[str, ...] = (),
    ) -> None:
        lines = [
            f"{method} {path} HTTP/1.1",
            "Host: proxy",
            f"Authorization: Bearer {KEY}",
            *(["Connection: close"] if close else []),
            *(["Content-Type: application/json"] if body else []),
            f"Content-Length: {len(body)}",
            *headers,
        ]
        self.sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)

    def _fill(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise Cut
        self.buf += data

    def _take(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            self._fill()
        return self._take(end + 2)[:-2]

    def head(self) -> Head:
        status = int(self._line().split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while line := self._line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        volatile = {name: headers.pop(name) for name in VOLATILE if name in headers}
        return Head(status, headers, volatile)

    def frame(self) -> bytes | None:
        """The next chunk of a chunked body; None at its last chunk."""
        size = int(self._line(), 16)
        if size == 0:
            assert self._line() == b""
            return None
        data = self._take(size + 2)
        assert data.endswith(b"\r\n")
        return data[:-2]

    def frames_until(self, end: bytes) -> list[bytes]:
        """Chunks up to the one that ends the body read so far with `end`."""
        frames: list[bytes] = []
        while not b"".join(frames).endswith(end):
            frame = self.frame()
            assert frame is not None, frames
            frames.append(frame)
        return frames

    def rest(self) -> tuple[list[bytes], bool]:
        """The chunks still to come, and whether the body ended with its last chunk."""
        frames: list[bytes] = []
        try:
            while (frame := self.frame()) is not None:
                frames.append(frame)
        except Cut:
            return frames, False
        return frames, True

    def whole(self, length: int) -> bytes:
        return self._take(length)

    def trailing(self) -> bytes:
        """Whatever comes after the answer, up to the end of the connection."""
        with contextlib.suppress(Cut):
            while True:
                self._fill()
        data = bytes(self.buf)
        self.buf.clear()
        return data

    def close(self) -> None:
        self.sock.close()


@dataclass
class Answer:
    head: Head
    frames: list[bytes]
    complete: bool
    trailing: bytes

    @property
    def body(self) -> bytes:
        return b"".join(self.frames)


def read_answer(raw: Raw) -> Answer:
    head = raw.head()
    if "content-length" in head.headers:
        frames, complete = [raw.whole(int(head.headers["content-length"]))], True
    elif head.headers.get("transfer-encoding") == "chunked":
        frames, complete = raw.rest()
    else:
        frames, complete = [], True
    return Answer(head, frames, complete, raw.trailing())


def chat(token: str, model: str = PRIMARY_MODEL, stream: bool = True) -> bytes:
    return orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": token}], "stream": stream}
    )


def messages(token: str, model: str = PRIMARY_MODEL) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": token}],
            "stream": True,
        }
    )


def post(proxy: Proxy, body: bytes, path: str = "/v1/chat/completions") -> Answer:
    raw = Raw(proxy)
    try:
        raw.send("POST", path, body)
        return read_answer(raw)
    finally:
        raw.close()


def event(text: str, model: str = PRIMARY_MODEL, end: bytes = b"\n\n") -> bytes:
    """One chat completion chunk as an SSE event."""
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + end


def message_event(text: str) -> bytes:
    """One Anthropic Messages stream event."""
    data = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    return b"event: content_block_delta\ndata: " + orjson.dumps(data) + b"\n\n"


def completion(text: str, model: str = PRIMARY_MODEL) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    )


def openai_error_event(message: str, code: str) -> bytes:
    """The last event of a stream the proxy ended, as the OpenAI SDKs read an error."""
    return (
        b'data: {"error":{"message":"' + message.encode() + b'","type":"server_error",'
        b'"param":null,"code":"' + code.encode() + b'"}}\n\n'
    )


def anthropic_error_event(message: str) -> bytes:
    return (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"'
        + message.encode()
        + b'"}}\n\n'
    )


def error_body(message: str, code: str) -> bytes:
    return (
        b'{"error":{"message":"' + message.encode() + b'","type":"server_error",'
        b'"param":null,"code":"' + code.encode() + b'"}}'
    )


def relayed(
    upstream_headers: dict[str, str],
    backend: str = "hosted",
    served: str | None = PRIMARY_MODEL,
    framing: tuple[str, str] = ("transfer-encoding", "chunked"),
) -> dict[str, str]:
    """The head a client gets: the upstream's headers, the proxy's own, the framing.
    `served` None: a pass-through answer, which names no model."""
    headers = {name.lower(): value for name, value in upstream_headers.items()}
    headers["x-kvmigrate-backend"] = backend
    if served is not None:
        headers["x-kvmigrate-served-model"] = served
    headers[framing[0]] = framing[1]
    headers["connection"] = "close"
    return headers


def check_volatile(head: Head, exchange: Exchange, model_route: bool = True) -> None:
    assert head.volatile["x-request-id"] == exchange.request_id
    assert head.volatile["date"].endswith(" GMT")
    if model_route:
        assert re.fullmatch(r"[0-9]+\.[0-9]{3}", head.volatile["x-kvmigrate-overhead-ms"])
    else:
        assert "x-kvmigrate-overhead-ms" not in head.volatile


def check_clock(exchange: Exchange) -> None:
    """The decode clock's figures, as they must relate whatever the machine's speed: one
    tick per read after the first, the longest gap within the decode and at least its mean."""
    chunks = list(exchange.chunks)
    assert exchange.first_byte is not None
    assert exchange.last_chunk is not None
    assert exchange.finished is not None
    assert exchange.started <= exchange.first_byte <= exchange.last_chunk <= exchange.finished
    assert exchange.later_chunks == len(chunks) - 1
    decode = exchange.last_chunk - exchange.first_byte
    if exchange.later_chunks == 0:
        assert exchange.last_chunk == exchange.first_byte
        assert exchange.max_chunk_gap == 0.0
    else:
        assert 0.0 < exchange.max_chunk_gap <= decode
        assert exchange.max_chunk_gap >= decode / exchange.later_chunks
    if exchange.later_chunks == 1:
        assert exchange.max_chunk_gap == decode


@contextlib.contextmanager
def sdk(proxy: Proxy) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=proxy.url + "/v1", api_key=KEY, max_retries=0, timeout=DEADLINE_S
    )
    try:
        yield client
    finally:
        client.close()


def rewritten(data: bytes, requested: str) -> bytes:
    """The candidate's bytes as a client that asked for `requested` gets them."""
    served = b'"model":"' + CANDIDATE_MODEL.encode() + b'"'
    return data.replace(served, b'"model":"' + requested.encode() + b'"')
