"""aiohttp's private internals that kvmigrate's server side relies on, and why.

aiohttp owns the client's connection: it reads the requests and decides when to close. Its
public API has no hook for what the proxy needs there (serving.py, proxy/client_answer.py):
  - a shorter deadline for a connection's first request head than for an idle kept-alive
    one, and a count of the connections its idle check closes (`ConnectionLimits`);
  - a handler that runs on when its client leaves, on a server that cancels the others
    (`outlive_client`), and every handler ended at once on a second stop signal (`hurry`);
  - its own RequestHandler subclass and settings on the Server that AppRunner builds;
  - an answer whose head kvmigrate writes itself (`ClientAnswer`) that still tells aiohttp
    whether the connection stays open.
Each private name is listed in `PRIVATE_NAMES` with what needs it, and touched only here.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

LIBRARY = "aiohttp"

PRIVATE_NAMES: dict[str, str] = {
    # RequestHandler's idle timer: ConnectionLimits (serving.EnvelopeRequestHandler).
    "_keepalive_handle": "RequestHandler's idle timer (a TimerHandle or None), armed by "
    "aiohttp for keepalive_timeout from the connection's start: re-armed for a first "
    "request head's header_timeout (ConnectionLimits)",
    "_next_keepalive_close_time": "when the idle timer closes the connection (loop time); "
    "set with the timer (ConnectionLimits.header_timeout)",
    "_process_keepalive": "RequestHandler's idle check, the timer's callback: overridden to "
    "count what it closes (kvmigrate_connections_closed_total, header_timeout or idle)",
    "_keepalive": "whether the connection may be kept alive; the idle check closes nothing "
    "when it is false (connections_closed count)",
    "_force_close": "whether the connection is closing already; the idle check closes "
    "nothing then (connections_closed count)",
    "_waiter": "the future RequestHandler awaits the next request on (None while one is "
    "handled): the idle check closes only a waiting connection (connections_closed count)",
    "_request_count": "requests served on the connection: none means the header timeout "
    "closed it, some an idle kept-alive one (connections_closed reason)",
    "_loop": "the RequestHandler's and Server's event loop: the idle timer's clock, and what "
    "each RequestHandler is built with (EnvelopeServer)",
    # RequestHandler's handler task: outlive_client, and serve_until's hurry.
    "_current_request": "the request being handled (None between requests): read when the "
    "client leaves, to spare a handler marked by outlive_client",
    "_task_handler": "the task connection_lost cancels under handler_cancellation: cleared "
    "to spare a handler marked by outlive_client; cancelled on a second stop signal (hurry)",
    # AppRunner and Server: EnvelopeAppRunner.
    "_make_server": "AppRunner's step that builds the Server from the application: the one "
    "place to give it our RequestHandler subclass and settings before it listens",
    "_kwargs": "the RequestHandler keyword arguments AppRunner gave the Server: each of our "
    "handlers is built with them, keepalive_timeout set to ConnectionLimits.idle_timeout",
    # StreamResponse: ClientAnswer.
    "_keep_alive": "what StreamResponse.keep_alive returns, read by aiohttp once the handler "
    "returns to keep or close the connection: ClientAnswer writes its own head and never "
    "runs prepare(), which sets it; the public force_close() can only clear it",
}

HandlerT = TypeVar("HandlerT", bound=RequestHandler)
ServerT = TypeVar("ServerT", bound=web.Server)


# -- RequestHandler: the idle timer ---------------------------------------------------------


def loop_of(handler: RequestHandler) -> asyncio.AbstractEventLoop:
    """The loop the handler's idle timer runs on (RequestHandler keeps no public reference)."""
    return handler._loop


def rearm_idle_timer(handler: RequestHandler, delay: float) -> None:
    """Close the connection `delay` seconds from now if it is still waiting for a request:
    aiohttp's own idle timer, cancelled and armed again (its deadline is keepalive_timeout
    from the connection's start, with no public way to give a first request head another)."""
    loop = handler._loop
    if handler._keepalive_handle is not None:
        handler._keepalive_handle.cancel()
    handler._next_keepalive_close_time = loop.time() + delay
    handler._keepalive_handle = loop.call_at(
        handler._next_keepalive_close_time, handler._process_keepalive
    )


class IdleCheckedRequestHandler(RequestHandler):
    """A RequestHandler told when aiohttp's idle check is about to close its connection
    (`closing_idle`), which aiohttp neither logs nor signals."""

    def closing_idle(self, served: bool) -> None:
        """The idle check is closing this connection for want of a request: its first
        (`served` false: the header timeout) or its next (an idle kept-alive connection)."""

    def _process_keepalive(self) -> None:
        # aiohttp's own conditions for closing (web_protocol.RequestHandler._process_keepalive):
        # not closing already, keep-alive on, the deadline passed, waiting for a request.
        if (
            self._keepalive
            and not self._force_close
            and self._loop.time() >= self._next_keepalive_close_time
            and self._waiter is not None
            and not self._waiter.done()
        ):
            self.closing_idle(served=bool(self._request_count))
        super()._process_keepalive()


# -- RequestHandler: the handler's task -----------------------------------------------------


def request_in_handling(handler: RequestHandler) -> BaseRequest | None:
    """The request the connection's handler is running for, if any."""
    return handler._current_request


def spare_handler(handler: RequestHandler) -> None:
    """Keep the connection's running handler from being cancelled when its client leaves:
    `connection_lost` cancels the task it holds, and then holds none. The handler notices
    the client is gone at its next write."""
    handler._task_handler = None


def cancel_handler(handler: RequestHandler) -> None:
    """Cancel the connection's running handler, if any (aiohttp's shutdown only waits)."""
    task = handler._task_handler
    if task is not None:
        task.cancel()


# -- AppRunner and Server -------------------------------------------------------------------


class ServerHookedAppRunner(web.AppRunner):
    """An AppRunner whose Server goes through `adapt_server` before it listens."""

    def adapt_server(self, server: web.Server) -> web.Server:
        """The Server to listen with, made from the one AppRunner built."""
        return server

    async def _make_server(self) -> web.Server:
        return self.adapt_server(await super()._make_server())


def adopt_server(server: web.Server, cls: type[ServerT]) -> ServerT:
    """`server`, now of class `cls`: a subclass of its own that adds no construction. AppRunner
    builds the Server from the application's private handler and request factory; changing
    its class keeps all of that and lets `cls` build the connections' handlers."""
    server.__class__ = cls
    assert isinstance(server, cls)
    return server


def handler_kwargs(server: web.Server) -> dict[str, Any]:
    """The keyword arguments the Server builds each RequestHandler with (the live dict:
    a change applies to the connections accepted after it)."""
    return server._kwargs


def new_handler(server: web.Server, cls: type[HandlerT]) -> HandlerT:
    """What `Server.__call__` builds for a new connection, of class `cls` (without its
    fallback for settings a RequestHandler rejects: ours takes aiohttp's)."""
    return cls(server, loop=server._loop, **server._kwargs)


# -- StreamResponse -------------------------------------------------------------------------


def set_keep_alive(response: web.StreamResponse, keep_alive: bool) -> None:
    """Whether aiohttp keeps the connection open once the handler returns `response`, for a
    response whose head was written without `prepare()`."""
    response._keep_alive = keep_alive
