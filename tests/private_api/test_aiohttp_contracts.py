"""What kvmigrate relies on of aiohttp's internals still holds for the installed aiohttp.

Each name in `kvmigrate.vendor_internals.aiohttp_internals.PRIVATE_NAMES` is checked here:
that it is still where the helpers reach for it (RequestHandler's are slots: a moved one
would be set in our subclass's own dict without a word), and that the behaviour the proxy
builds on it still follows, on a real server on loopback. A failure names the attribute
and the kvmigrate feature that needs it: read the new aiohttp's code for where it went,
change the helper, and only then raise the pin in pyproject.toml.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from kvmigrate.serving import (
    CONNECTION_LIMITS,
    ConnectionLimits,
    EnvelopeAppRunner,
    EnvelopeRequestHandler,
    EnvelopeServer,
    outlive_client,
)
from kvmigrate.vendor_internals import aiohttp_internals as internals
from kvmigrate.vendor_internals.aiohttp_internals import PRIVATE_NAMES

HANDLER_SLOTS = (
    "_keepalive_handle",
    "_next_keepalive_close_time",
    "_keepalive",
    "_force_close",
    "_waiter",
    "_request_count",
    "_loop",
    "_current_request",
    "_task_handler",
)
METHODS: dict[str, tuple[type, bool]] = {  # name: (owner, a coroutine function)
    "_process_keepalive": (RequestHandler, False),
    "_make_server": (web.AppRunner, True),
}
INSTANCE_ATTRIBUTES = ("_kwargs", "_keep_alive")  # checked on a Server, a StreamResponse


def moved(names: str | tuple[str, ...], what: str) -> str:
    """The failure's message: what changed, and what each private name is needed for."""
    needs = "; ".join(
        f"`{name}` for {PRIVATE_NAMES[name]}"
        for name in ((names,) if isinstance(names, str) else names)
    )
    return (
        f"aiohttp {aiohttp.__version__}: {what}. kvmigrate needs {needs} "
        "(kvmigrate/vendor_internals/aiohttp_internals.py)"
    )


def test_every_private_name_has_a_contract() -> None:
    checked = {*HANDLER_SLOTS, *METHODS, *INSTANCE_ATTRIBUTES}
    assert set(PRIVATE_NAMES) == checked, "a private name without its contract test, or stale"


def _slots(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        names.update([slots] if isinstance(slots, str) else slots)
    return names


@pytest.mark.parametrize("name", HANDLER_SLOTS)
def test_request_handler_keeps_its_slot(name: str) -> None:
    assert name in _slots(RequestHandler), moved(name, f"RequestHandler has no slot `{name}`")


@pytest.mark.parametrize("name", list(METHODS))
def test_private_method_is_still_there(name: str) -> None:
    owner, coroutine = METHODS[name]
    method = vars(owner).get(name)
    assert callable(method), moved(name, f"{owner.__qualname__} defines no `{name}`")
    assert list(inspect.signature(method).parameters) == ["self"], moved(
        name, f"{owner.__qualname__}.{name} now takes arguments"
    )
    assert inspect.iscoroutinefunction(method) == coroutine, moved(
        name, f"{owner.__qualname__}.{name} changed between a coroutine and a function"
    )


def test_server_builds_each_handler_from_its_kwargs() -> None:
    async def check() -> None:
        server = web.Server(lambda request: web.Response(), keepalive_timeout=7.5)
        kwargs = internals.handler_kwargs(server)
        assert kwargs == {"keepalive_timeout": 7.5}, moved("_kwargs", "Server keeps no _kwargs")
        kwargs["keepalive_timeout"] = 3.0
        handler = server()
        assert handler._keepalive_timeout == 3.0, moved(
            "_kwargs", "Server.__call__ no longer builds its RequestHandler from _kwargs"
        )
        assert internals.loop_of(handler) is asyncio.get_running_loop(), moved(
            "_loop", "a RequestHandler's _loop is not the loop it runs on"
        )
        built = internals.new_handler(server, EnvelopeRequestHandler)
        assert built._keepalive_timeout == 3.0, moved("_kwargs", "new_handler lost a setting")

    asyncio.run(check())


def test_stream_response_keep_alive_reads_the_attribute_set() -> None:
    response = web.StreamResponse()
    assert response.keep_alive is None, moved("_keep_alive", "a new response's keep_alive")
    for value in (True, False):
        internals.set_keep_alive(response, value)
        assert response.keep_alive is value, moved(
            "_keep_alive", "StreamResponse.keep_alive no longer returns _keep_alive"
        )


# -- on a real server on loopback -----------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST = b"GET /%b HTTP/1.1\r\nHost: test\r\n\r\n"


@asynccontextmanager
async def serving(
    routes: dict[str, Handler], limits: ConnectionLimits | None = None
) -> AsyncIterator[tuple[EnvelopeAppRunner, int]]:
    """The proxy's own runner (EnvelopeAppRunner) serving `routes` on a free loopback port."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(f"/{path}", handler)
    if limits is not None:
        app[CONNECTION_LIMITS] = limits
    runner = EnvelopeAppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield runner, runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def closed_after(reader: asyncio.StreamReader, limit: float = 10.0) -> float:
    """Seconds until the server closes the connection (whatever it sends before is read);
    infinity if it has not within `limit`."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return float("inf")
    return time.monotonic() - start


def test_idle_timer_rearmed_and_its_closes_counted() -> None:
    """A first request head gets `header_timeout` (the idle timer re-armed at the connection's
    start), a kept-alive connection `idle_timeout` (the Server's handler kwargs), and the
    idle check tells `closing_idle` which one closed it."""
    closed: list[str] = []
    limits = ConnectionLimits(0.2, 2.0, 100, on_close=closed.append)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def check() -> None:
        async with serving({"ok": ok}, limits) as (runner, port):
            assert type(runner.server) is EnvelopeServer, moved(
                "_make_server", "AppRunner's Server did not go through _make_server"
            )
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            silent = await closed_after(reader)
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST % b"ok")
            assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
            idle = await closed_after(reader)
            writer.close()
        timer = ("_keepalive_handle", "_next_keepalive_close_time", "_loop")
        check = ("_process_keepalive", "_waiter", "_request_count", "_keepalive", "_force_close")
        assert silent < 1.5, moved(timer, f"a silent connection lasted {silent:.2f} s")
        assert 1.8 <= idle < 9, moved(
            ("_kwargs", *check), f"an idle connection was closed after {idle:.2f} s"
        )
        assert closed == ["header_timeout", "idle"], moved(
            check, f"the idle check's closes were counted as {closed}"
        )

    asyncio.run(check())


def test_a_spared_handler_outlives_its_client_and_others_are_cancelled() -> None:
    """With handler_cancellation, aiohttp cancels a handler whose client leaves through
    `_task_handler`, unless `spare_handler` cleared it (on `_current_request`'s mark)."""
    started = {"spared": asyncio.Event(), "plain": asyncio.Event()}
    ended: dict[str, str] = {}

    def handler(name: str) -> Handler:
        async def handle(request: web.Request) -> web.Response:
            if name == "spared":
                outlive_client(request)
            started[name].set()
            try:
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                ended[name] = "cancelled"
                raise
            ended[name] = "finished"
            return web.Response(text="late")

        return handle

    async def check() -> None:
        async with serving({name: handler(name) for name in started}) as (_runner, port):
            for name, event in started.items():
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(REQUEST % name.encode())
                await asyncio.wait_for(event.wait(), 5)
                writer.close()
            await asyncio.sleep(1.0)

    asyncio.run(check())
    assert ended.get("plain") == "cancelled", moved(
        "_task_handler", f"a client that left did not cancel its handler: {ended}"
    )
    assert ended.get("spared") == "finished", moved(
        ("_task_handler", "_current_request"), f"a spared handler was not spared: {ended}"
    )


def test_cancel_handler_ends_a_running_handler() -> None:
    started, ended = asyncio.Event(), []

    async def slow(request: web.Request) -> web.Response:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        return web.Response()

    async def check() -> None:
        async with serving({"slow": slow}) as (runner, port):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST % b"slow")
            await asyncio.wait_for(started.wait(), 5)
            assert runner.server is not None
            for handler in runner.server.connections:
                internals.cancel_handler(handler)
            await asyncio.sleep(0.2)
            writer.close()

    asyncio.run(check())
    assert ended == ["cancelled"], moved("_task_handler", "cancelling it left the handler running")


class _OwnHead(web.StreamResponse):
    """An answer whose head the handler writes itself, as ClientAnswer does."""

    def __init__(self, request: BaseRequest, keep_alive: bool) -> None:
        super().__init__()
        assert request.transport is not None
        connection = b"" if keep_alive else b"Connection: close\r\n"
        request.transport.write(b"HTTP/1.1 200 OK\r\n%bContent-Length: 2\r\n\r\nok" % connection)
        internals.set_keep_alive(self, keep_alive)

    async def prepare(self, request: BaseRequest) -> Any:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


@pytest.mark.parametrize("keep_alive", [True, False])
def test_an_answer_written_by_hand_keeps_or_closes_its_connection(keep_alive: bool) -> None:
    async def own(request: web.Request) -> web.StreamResponse:
        return _OwnHead(request, keep_alive)

    async def check() -> bool:
        async with serving({"own": own}) as (_runner, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST % b"own")
            await reader.readuntil(b"\r\n\r\nok")
            writer.write(REQUEST % b"own")
            async with asyncio.timeout(5):
                second = await reader.read(65536)
            writer.close()
            return bool(second)

    served_again = asyncio.run(check())
    assert served_again == keep_alive, moved(
        "_keep_alive", f"keep_alive {keep_alive} did not decide whether the connection stayed"
    )
