"""Sending bodies and event streams, with decode pacing and mid-body faults.

Every response body goes through here, so the faults that strike after the first byte
(disconnect, stall, malformed output) work on every endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiohttp import web

from kvmigrate.emulator.faults import NO_FAULTS, FaultPlan
from kvmigrate.emulator.wire import JSON, Step
from kvmigrate.wire import sse_frames
from kvmigrate.wire.sse_frames import DONE

try:
    FAULT_PLAN: Any = web.RequestKey("emulator_fault_plan", FaultPlan)
except AttributeError:  # aiohttp before 3.13 keys request storage by string
    FAULT_PLAN = "kvmigrate.emulator.fault_plan"
SHUTDOWN: web.AppKey[asyncio.Event] = web.AppKey("emulator_shutdown", asyncio.Event)
DONE_FRAME = DONE
GARBAGE_SSE = b'data: {"id": "chatcmpl-broken", "choices": [{"delta": \n\nnot-an-sse-line\n\n'

Frame = Callable[[JSON], bytes]
_COALESCE_FRAMES = 64


def dumps(payload: Any) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def data_frame(chunk: JSON) -> bytes:
    return sse_frames.data_frame(dumps(chunk))


def event_frame(event: JSON) -> bytes:
    return sse_frames.event_frame(str(event["type"]), dumps(event))


def fault_plan(request: web.Request) -> FaultPlan:
    plan = request.get(FAULT_PLAN, NO_FAULTS)
    assert isinstance(plan, FaultPlan)
    return plan


async def pause(request: web.Request, seconds: float) -> None:
    """Sleep, but wake when the app shuts down, so a stalled or hung handler cannot hold a
    server's shutdown for its full timeout. `math.inf` waits for shutdown only."""
    if seconds <= 0:
        return
    event = request.app[SHUTDOWN]
    timeout = None if math.isinf(seconds) else seconds
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.close()


async def send_json(
    request: web.Request,
    payload: JSON,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    body = dumps(payload)
    plan = fault_plan(request)
    if status >= 400 or not plan.mid_body:
        return web.Response(
            body=body, status=status, content_type="application/json", headers=headers
        )
    if plan.malformed:
        broken = body[: max(len(body) // 2, 1)] + b"<!-- truncated -->"
        return web.Response(body=broken, status=status, content_type="application/json")
    response = web.StreamResponse(status=status, headers=headers)
    response.content_type = "application/json"
    response.content_length = len(body)
    await response.prepare(request)
    half = len(body) // 2
    with contextlib.suppress(ConnectionError):
        await response.write(body[:half])
        if plan.disconnect:
            _drop_connection(request)
            return response
        await pause(request, plan.stall_s or 0.0)
        await response.write(body[half:])
    return response


async def send_stream(
    request: web.Request,
    steps: Iterable[Step],
    gap_s: float,
    frame: Frame = data_frame,
    done: bool = True,
    on_first_token: Callable[[], None] | None = None,
) -> web.StreamResponse:
    """Stream `steps` as SSE. Paced steps after the first paced one wait `gap_s` each; the
    first paced step is the first token, reported through `on_first_token`."""
    plan = fault_plan(request)
    planned = list(steps)
    fault_at = max(len(planned) // 2, 1) if plan.mid_body else -1
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    first_token_seen = False
    # Without pacing, one write per chunk only costs syscalls: coalesce them.
    pending: list[bytes] = []
    try:
        for index, (chunks, paced) in enumerate(planned):
            if index == fault_at:
                await _flush(response, pending)
                if await _mid_stream_fault(request, response, plan):
                    return response
            if paced and first_token_seen and gap_s > 0:
                await asyncio.sleep(gap_s)
            pending.extend(frame(c) for c in chunks)
            if gap_s > 0 or len(pending) >= _COALESCE_FRAMES:
                await _flush(response, pending)
            if paced and not first_token_seen:
                first_token_seen = True
                if on_first_token is not None:
                    on_first_token()
        if done:
            pending.append(DONE_FRAME)
        await _flush(response, pending)
    except ConnectionError:
        pass  # the client went away; nothing is left to send it
    return response


async def _flush(response: web.StreamResponse, pending: list[bytes]) -> None:
    if pending:
        data = b"".join(pending)
        pending.clear()
        await response.write(data)


async def _mid_stream_fault(
    request: web.Request, response: web.StreamResponse, plan: FaultPlan
) -> bool:
    """Apply the plan's mid-stream fault; True when the stream must end here."""
    if plan.disconnect:
        _drop_connection(request)
        return True
    if plan.malformed:
        await response.write(GARBAGE_SSE)
    if plan.stall_s is not None:
        await pause(request, plan.stall_s)
    return False


async def send_misframed(request: web.Request, kind: str) -> web.StreamResponse:
    """An answer no client can read as one (faults.MISFRAMED): a redirect, the other
    framing than the request asked for, or an event stream with no line end."""
    if kind == "redirect":
        raise web.HTTPFound("http://127.0.0.1:9/elsewhere")
    if kind == "wrong-framing":
        try:
            asked_to_stream = json.loads(await request.read()).get("stream") is True
        except (ValueError, AttributeError):
            asked_to_stream = False
        if asked_to_stream:
            return web.json_response({"id": "chatcmpl-misframed", "object": "chat.completion"})
        framed = data_frame({"id": "chatcmpl-misframed", "choices": []}) + DONE_FRAME
        return web.Response(body=framed, content_type="text/event-stream")
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    with contextlib.suppress(ConnectionError):
        for _ in range(4):
            await response.write(b"x" * 16384)
    return response
