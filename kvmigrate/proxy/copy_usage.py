"""A streamed copy's request asks for the usage chunk: the copy's token counts are evidence."""

from __future__ import annotations

import orjson

from kvmigrate.proxy.body import RequestBody
from kvmigrate.proxy.chained import RESPONSES
from kvmigrate.proxy.forward import Call


def with_usage(call: Call, body: RequestBody, path: str = "") -> Call:
    """A streamed copy asks for the usage chunk even when the client did not: nobody reads
    the copy but us, and its token counts (cached tokens above all) are the evidence. A
    Responses stream always ends with its usage, in `response.completed`."""
    options = body.data.get("stream_options")
    if not body.stream or (isinstance(options, dict) and options.get("include_usage")):
        return call
    if path == RESPONSES:
        return call
    start = call.body.lstrip()
    if "stream_options" not in body.data and start[:1] == b"{":
        # Spliced in front, as `model` is: re-encoding the copy's whole body (an agent's
        # context, often 100 KB) was a parse and a dump per shadow copy.
        # Joined from a view: one copy of the body, where a slice and a sum made two.
        spliced = b"".join((b'{"stream_options":{"include_usage":true},', memoryview(start)[1:]))
        return Call(call.method, call.url, spliced, call.headers)
    data = orjson.loads(call.body)
    data["stream_options"] = {
        **(options if isinstance(options, dict) else {}),
        "include_usage": True,
    }
    return Call(call.method, call.url, orjson.dumps(data), call.headers)
