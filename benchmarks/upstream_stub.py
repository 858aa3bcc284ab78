"""A minimal, fast OpenAI-shaped upstream for measuring what a proxy adds.

It answers every POST to /v1/chat/completions with a canned completion, or a canned SSE
stream when the body asks for one (a role chunk, then 16 content chunks, one write each),
so the upstream's own cost is as small as possible and the same in every configuration.
Model `slow-stream` holds a stream open for a while, for the memory test with many open
streams.

    python benchmarks/upstream_stub.py --port 9000
"""

from __future__ import annotations

import argparse
import asyncio

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


async def handle(request: web.BaseRequest) -> web.StreamResponse:
    body = await request.read()
    if b'"stream":true' not in body.replace(b" ", b""):
        return web.Response(body=COMPLETION, content_type="application/json")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if b"slow-stream" in body:
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


async def serve(host: str, port: int) -> None:
    server = web.Server(handle, access_log=None)
    loop = asyncio.get_running_loop()
    await loop.create_server(server, host, port, backlog=4096)
    print(f"stub on http://{host}:{port}/v1", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
