"""A minimal, fast OpenAI-shaped upstream for measuring what a proxy adds.

It answers every POST to /v1/chat/completions with a canned completion, or a canned SSE
stream when the body asks for one (a role chunk, then 16 content chunks, one write each;
to /v1/messages, the same in Anthropic's wire format),
so the upstream's own cost is as small as possible and the same in every configuration.
Model `slow-stream` holds a stream open for a while, for the memory test with many open
streams.

    python benchmarks/upstream_stub.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio
import functools

import orjson
from aiohttp import web

COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "stub",
        "system_fingerprint": "fp_stub",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Sure. The failing test needs the fixture to be reset between runs.",
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 812,
            "completion_tokens": 14,
            "total_tokens": 826,
            "prompt_tokens_details": {"cached_tokens": 768},
        },
    }
)
# Anthropic's Messages API, for /v1/messages: the same answer in its wire format.
MESSAGE = orjson.dumps(
    {
        "id": "msg_01stub",
        "type": "message",
        "role": "assistant",
        "model": "stub",
        "content": [
            {"type": "text", "text": "Sure. The failing test needs the fixture to be reset."}
        ],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 44, "cache_read_input_tokens": 768, "output_tokens": 14},
    }
)
MESSAGE_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_01stub",'
    b'"type":"message","role":"assistant","model":"stub","content":[],"stop_reason":null,'
    b'"stop_sequence":null,"usage":{"input_tokens":44,"cache_read_input_tokens":768,'
    b'"output_tokens":1}}}\n\n'
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
MESSAGE_EVENT = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    b'"delta":{"type":"text_delta","text":" token"}}\n\n'
)
MESSAGE_TAIL = (
    b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn",'
    b'"stop_sequence":null},"usage":{"output_tokens":16}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
)
ROLE = (
    b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"stub","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"finish_reason":null}]}\n\n'
)
CHUNK = (
    b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"stub","choices":[{"index":0,"delta":{"content":" token"},'
    b'"finish_reason":null}]}\n\n'
)
TAIL = (
    b'data: {"id":"chatcmpl-stub","object":"chat.completion.chunk","created":1700000000,'
    b'"model":"stub","choices":[],"usage":{"prompt_tokens":812,"completion_tokens":16,'
    b'"total_tokens":828,"prompt_tokens_details":{"cached_tokens":768}}}\n\n'
    b"data: [DONE]\n\n"
)


async def handle(request: web.BaseRequest, delay: float = 0.0) -> web.StreamResponse:
    body = await request.read()
    if delay:
        await asyncio.sleep(delay)  # an engine's prefill: the answer's first byte waits
    messages = request.path.endswith("/messages")
    if b'"stream":true' not in body.replace(b" ", b""):
        whole = MESSAGE if messages else COMPLETION
        return web.Response(body=whole, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if messages:
        await response.write(MESSAGE_START)
        for _ in range(16):
            await response.write(MESSAGE_EVENT)
        await response.write(MESSAGE_TAIL)
    elif b"slow-stream" in body:
        for _ in range(30):
            await response.write(CHUNK)
            await asyncio.sleep(1.0)
    else:
        # As an engine streams: the role chunk first, then one write per token, so time to
        # first content chunk includes what a proxy does between two upstream chunks.
        await response.write(ROLE)
        for _ in range(16):
            await response.write(CHUNK)
        await response.write(TAIL)
    await response.write_eof()
    return response


async def serve(host: str, port: int, delay: float = 0.0) -> None:
    server = web.Server(functools.partial(handle, delay=delay), access_log=None)
    loop = asyncio.get_running_loop()
    await loop.create_server(server, host, port, backlog=4096)
    print(f"stub on http://{host}:{port}/v1", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="wait this long before answering, as an engine's prefill does (default: none)",
    )
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port, args.delay_ms / 1000))


if __name__ == "__main__":
    main()
