"""Running aiohttp applications: in the foreground for the CLI, or on a background thread.

The background form is what the demo, the benchmarks and the tests use to stand up real
servers on free loopback ports inside one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType

from aiohttp import web

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


def run_app_forever(app: web.Application, host: str, port: int, banner: str = "") -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully."""
    install_fast_event_loop()
    web.run_app(
        app,
        host=host,
        port=port,
        access_log=None,
        print=(lambda _msg: print(banner, flush=True)) if banner else None,
        shutdown_timeout=5.0,
    )


class BackgroundServer:
    """Serve an aiohttp application on its own event loop in a daemon thread.

    >>> with BackgroundServer(make_app) as server:
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app_factory: AppFactory, host: str = "127.0.0.1", port: int = 0) -> None:
        self._app_factory = app_factory
        self.host = host
        self.port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
            self.port = free_port(self.host)
        self._thread = threading.Thread(target=self._serve, name=f"server:{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"server on {self.url} failed to start") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._loop = self._thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

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
        app = self._app_factory()
        if not isinstance(app, web.Application):
            app = await app
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
