"""Running aiohttp applications: in the foreground for the CLI, or on a background thread.

The background form is what the demo, the benchmarks and the tests use to stand up real
servers on free loopback ports inside one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import orjson
from aiohttp import hdrs, http_exceptions, web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from kvmigrate.collector import settle_collector
from kvmigrate.logtext import printable
from kvmigrate.vendor_internals.aiohttp_internals import (
    IdleCheckedRequestHandler,
    ServerHookedAppRunner,
    adopt_server,
    cancel_handler,
    handler_kwargs,
    loop_of,
    new_handler,
    rearm_idle_timer,
    request_in_handling,
    spare_handler,
)

log = logging.getLogger("kvmigrate.serving")
LIMIT_WARNING_INTERVAL = 10.0
AppFactory = Callable[[], Awaitable[web.Application]] | Callable[[], web.Application]


def install_fast_event_loop() -> None:
    """Use uvloop when it is installed: it roughly halves per-request loop overhead."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _what_failed(exc: BaseException | None) -> str:
    """What was wrong with a request, in our words: never a quote of the request itself."""
    for kind, text in _PARSE_FAILURES:
        if isinstance(exc, kind):
            return text
    return "it could not be parsed"


_PARSE_FAILURES: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "a header or the request line is too long"),
    (http_exceptions.InvalidHeader, "a header could not be parsed"),
    (http_exceptions.BadStatusLine, "the request line could not be parsed"),
    (http_exceptions.InvalidURLError, "the request target could not be parsed"),
    (http_exceptions.PayloadEncodingError, "the body's framing could not be parsed"),
)


@dataclass
class ConnectionLimits:
    """How long a client may take to send a request head, how long an idle kept-alive
    connection stays open, and how many connections may be open at once. Without them a
    thousand idle or header-trickling sockets hold file descriptors until the process can
    accept nothing else. `on_close(reason)` counts what was closed (a metric)."""

    header_timeout: float
    idle_timeout: float
    max_connections: int
    on_close: Callable[[str], None] = lambda _reason: None
    open: int = 0
    _last_warning: float = -LIMIT_WARNING_INTERVAL

    def over_limit(self, now: float) -> bool:
        if self.open <= self.max_connections:
            return False
        self.on_close("over_limit")
        if now - self._last_warning >= LIMIT_WARNING_INTERVAL:
            self._last_warning = now
            log.warning(
                "%d client connections open, over server.max_connections (%d): new ones "
                "are closed at once (metric kvmigrate_connections_closed_total)",
                self.open,
                self.max_connections,
            )
        return True


def default_max_connections() -> int:
    """A third of the file-descriptor limit: a request can hold a client, an upstream and a
    shadow connection, and the process needs some for its stores and logs."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(64, soft // 3) if soft != resource.RLIM_INFINITY else 100_000


CONNECTION_LIMITS = web.AppKey("kvmigrate_connection_limits", ConnectionLimits)
# POST routes an application answers past aiohttp's router and middlewares: exact paths, as
# the router matches them (`path_safe`: `%2F` stays encoded), to handlers that are their own
# error boundary. A request with `Expect` goes the router's way, for the route's expect
# handler; any other path or method too.
RequestHandlerFn = Callable[[web.Request], Awaitable[web.StreamResponse]]
DIRECT_POSTS: web.AppKey[dict[str, RequestHandlerFn]] = web.AppKey("kvmigrate_direct_posts")


class EnvelopeRequestHandler(IdleCheckedRequestHandler):
    """Closes connections as `ConnectionLimits` says (when the application sets them), and
    answers protocol-level errors in OpenAI's envelope (below)."""

    _limits: ConnectionLimits | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        limits = self._limits
        if limits is None:
            return
        limits.open += 1
        if limits.over_limit(loop_of(self).time()):
            self.force_close()
            return
        # aiohttp closes a connection idle for `keepalive_timeout`, from its start too; a
        # first request head gets only `header_timeout`.
        rearm_idle_timer(self, limits.header_timeout)

    def closing_idle(self, served: bool) -> None:
        """Counts what aiohttp's idle check closes: a connection that never sent a whole
        request head (header_timeout), or a kept-alive one with no next request (idle: a
        client pool, not a slow client)."""
        if self._limits is not None:
            self._limits.on_close("idle" if served else "header_timeout")

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._limits is not None:
            self._limits.open -= 1
        request = request_in_handling(self)
        if request is not None and request.get(_OUTLIVES_CLIENT):
            spare_handler(self)
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """Answers requests that fail below the application (a malformed request line, bad
        headers, an oversized header block) in OpenAI's error envelope too, never plain
        text."""
        if isinstance(exc, ConnectionError):
            # Not malformed: the client left while its answer was being written (a handler
            # that outlives its client, see outlive_client). There is no one to answer.
            raise ConnectionError("the client closed the connection") from exc
        # A malformed request is the client's problem: one debug line, no traceback. The
        # parser's own message quotes the offending line, which may be anyone's credential
        # under any header name: neither the log nor the answer repeats it.
        self.logger.debug(
            "malformed request from %s: %s", printable(request.remote), _what_failed(exc)
        )
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        if status < 500:
            text = f"Malformed HTTP request: {_what_failed(exc)}"
        else:
            text = "The server failed to handle this request."
        body = orjson.dumps(
            {
                "error": {
                    "message": text,
                    "type": "invalid_request_error" if status < 500 else "server_error",
                    "param": None,
                    "code": None,
                }
            }
        )
        response = web.Response(status=status, body=body, content_type="application/json")
        response.force_close()
        return response


def outlive_client(request: BaseRequest) -> None:
    """From here on, the request's handler runs to its end even if its client leaves: the
    handler notices at its next write. aiohttp, serving with `handler_cancellation`, would
    cancel it at the disconnect (what a proxy wants before the first byte: the upstream call
    stops). The alternative, a task per request to shield, cost CPU on every request
    (benchmarks/cpu_ab.py compares the two)."""
    request[_OUTLIVES_CLIENT] = True


_OUTLIVES_CLIENT = web.RequestKey("kvmigrate_outlives_client", bool)
# The drain `serve_until` gives what is in flight when the server stops, for an application
# that must end its long answers itself before it runs out (the proxy's streams).
DRAIN_KEY = web.AppKey("kvmigrate_drain_s", float)
# What an application ends at once when the operator asks a second time to stop (StopRequests).
HURRY_KEY: web.AppKey[Callable[[], None]] = web.AppKey("kvmigrate_hurry")


async def _direct_or_routed(
    direct: dict[str, RequestHandlerFn], routed: RequestHandlerFn, request: web.Request
) -> web.StreamResponse:
    if request.method == "POST" and hdrs.EXPECT not in request.headers:
        handler = direct.get(request.rel_url.path_safe)
        if handler is not None:
            return await handler(request)
    return await routed(request)


class EnvelopeServer(web.Server):
    limits: ConnectionLimits | None = None

    def __call__(self) -> RequestHandler:
        handler = new_handler(self, EnvelopeRequestHandler)
        handler._limits = self.limits
        return handler


class EnvelopeAppRunner(ServerHookedAppRunner):
    """An AppRunner whose protocol-level errors are JSON envelopes (see above), and whose
    handlers are cancelled when their client disconnects: a proxy must stop the upstream call
    of a client that gave up, and record that it did."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("handler_cancellation", True)
        super().__init__(app, **kwargs)

    def adapt_server(self, built: web.Server) -> web.Server:
        # aiohttp builds its Server inside the app; reuse its settings with our handler.
        server = adopt_server(built, EnvelopeServer)
        direct = self.app.get(DIRECT_POSTS)
        if direct:
            server.request_handler = partial(_direct_or_routed, direct, server.request_handler)
        limits = self.app.get(CONNECTION_LIMITS)
        if limits is not None:
            server.limits = limits
            handler_kwargs(server)["keepalive_timeout"] = limits.idle_timeout
        return server


def run_app_forever(
    app: web.Application, host: str, port: int, banner: str = "", drain_s: float | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully."""
    install_fast_event_loop()
    asyncio.run(_serve_forever(app, host, port, banner, DRAIN_S if drain_s is None else drain_s))


async def _serve_forever(
    app: web.Application, host: str, port: int, banner: str, drain_s: float
) -> None:
    asked = StopRequests()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, asked.signalled)

    def ready() -> None:
        if banner:
            print(banner, flush=True)

    await serve_until(app, host, port, asked.stop, ready, drain_s=drain_s, hurry=asked.hurry)


class StopRequests:
    """The operator's stop signals: the first asks for a graceful stop (`stop`: accept no
    more, let what is in flight finish within the drain), any later one for haste (`hurry`:
    end it now, as a second Ctrl-C ends uvicorn's). A drain sized for long agent streams
    (minutes) must not keep an operator who asked twice waiting for all of it."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.hurry = asyncio.Event()

    def signalled(self) -> None:
        (self.hurry if self.stop.is_set() else self.stop).set()


# How long a stopping server lets its in-flight requests and streams finish.
DRAIN_S = 5.0


async def serve_until(
    app: web.Application,
    host: str,
    port: int,
    stop: asyncio.Event,
    ready: Callable[[], None] = lambda: None,
    *,
    reuse_port: bool = False,
    drain_s: float = DRAIN_S,
    hurry: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set, then stop accepting and let what is in flight finish for
    up to `drain_s` seconds, or until `hurry` is set (then it ends at once: see `_hurried`).
    `reuse_port`: several processes listen on one port (SO_REUSEPORT) and the kernel spreads
    the connections among them. Once listening, the process serves until it is stopped: its
    collector is settled for that (a worker of `proxy --workers` that was not spent more CPU
    per request in collections: benchmarks/proxy_overhead.py)."""
    app[DRAIN_KEY] = drain_s
    runner = EnvelopeAppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=_phase_timeout(drain_s)
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=reuse_port or None)
        await site.start()
        settle_collector()
        ready()
        await stop.wait()
    finally:
        hurrying = asyncio.ensure_future(_hurried(hurry, runner)) if hurry is not None else None
        try:
            await runner.cleanup()
        finally:
            if hurrying is not None:
                hurrying.cancel()


async def _hurried(hurry: asyncio.Event, runner: web.AppRunner) -> None:
    """Once `hurry` is set, end every request still in flight: the application's own ending
    first (`HURRY_KEY`: the proxy ends its streams with an error event and records them),
    then aiohttp's handlers are cancelled, which ends its wait for them. What the
    application writes at cleanup (the proxy's records) is still written."""
    await hurry.wait()
    server = runner.server
    handlers = server.connections if server is not None else []
    log.warning("asked again to stop: ending %d connections now", len(handlers))
    end_now = runner.app.get(HURRY_KEY)
    if end_now is not None:
        end_now()
    for handler in handlers:
        cancel_handler(handler)


def _phase_timeout(drain_s: float) -> float:
    """aiohttp's shutdown timeout for a drain of `drain_s`. aiohttp waits that long for a
    handler, cancels the request's body (which does not stop a relay that is streaming) and
    waits that long again: a stream drained for twice the time asked, past the pool's kill
    (drain + 10 s) and an orchestrator's grace. Half in each wait keeps the total at
    `drain_s`. A timeout of 0 reads to aiohttp as none (wait forever): a drain of 0 gets a
    millisecond."""
    return max(drain_s / 2, 0.001)


# Longer than any cleanup of the proxy's own is bounded by: the recorder's stop waits 30 s
# for its workers to write what they hold (RecorderAddon.close).
CLEANUP_TIMEOUT = 60.0


class BackgroundServer:
    """Serve an aiohttp application on its own event loop in a daemon thread.

    >>> with BackgroundServer(make_app) as server:
    ...     httpx.get(server.url + "/health")
    """

    def __init__(
        self,
        app_factory: AppFactory,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._app_factory = app_factory
        self.host = host
        self.port = port
        self.tls = tls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: EnvelopeAppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    @property
    def app(self) -> web.Application:
        assert self._runner is not None, "server not started"
        return self._runner.app

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "server not started"
        return self._loop

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        if self.port == 0:
            # Bound here and handed to the server, so the port is held from the moment it is
            # named: a port found free and bound later can be taken in between by another
            # process (test workers running side by side start servers by the thousand).
            family = socket.getaddrinfo(self.host, 0, type=socket.SOCK_STREAM)[0][0]
            self._socket = socket.create_server((self.host, 0), family=family, backlog=128)
            self.port = self._socket.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name=f"server:{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"server on {self.url} failed to start") from self._error
        return self

    def stop(self, timeout: float = CLEANUP_TIMEOUT) -> None:
        """Stop serving and wait for the app's cleanup (its on_cleanup hooks, where the
        recorder writes what it still holds). Raises TimeoutError when the cleanup has not
        finished within `timeout`: returning would say that what it writes is written, while
        a daemon thread the interpreter's exit kills still holds it."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(
                f"the server on {self.url} did not finish its cleanup in {timeout:g} s"
            )
        self._loop = self._thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        except TimeoutError:
            if exc is None:
                raise
            log.error("the server on %s did not finish its cleanup", self.url)  # not masking exc

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._open())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._close())
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _open(self) -> None:
        sock, self._socket = self._socket, None  # the server's from here: it closes it
        try:
            app = self._app_factory()
            if not isinstance(app, web.Application):
                app = await app
            self._runner = EnvelopeAppRunner(app, access_log=None, handle_signals=False)
            await self._runner.setup()
            site: web.BaseSite
            if sock is not None:
                site = web.SockSite(self._runner, sock, ssl_context=self.tls)
            else:
                site = web.TCPSite(
                    self._runner, self.host, self.port, reuse_address=True, ssl_context=self.tls
                )
            await site.start()
        except BaseException:
            if sock is not None:
                sock.close()
            raise

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
