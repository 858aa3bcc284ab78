"""A backend of `type: litellm`: a loopback OpenAI-compatible server that calls litellm.

The proxy's forwarding path does not change for it. Each litellm backend gets a small
aiohttp server on 127.0.0.1 in the proxy's own event loop, and the proxy's upstream for that
backend points at it: shadow, split, fallback, recording and rollout all see an
OpenAI-compatible upstream. The server turns each request into `litellm.acompletion`,
`atext_completion`, `aembedding` or `aresponses` with the model string of `models:`
(`bedrock/...`, `vertex_ai/...`, `anthropic/...`) and the backend's credentials from the
config, and answers in OpenAI's wire format, streaming chunk by chunk.

The loopback server accepts only a random per-process key that the proxy sends, so no other
local process can spend the backend's credentials through it; the client's own key never
reaches litellm. litellm is imported only when such a backend is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any

import orjson
from aiohttp import web
from msgspec.structs import replace

from kvmigrate.config import BackendConfig, Config, Secret
from kvmigrate.litellm_bridge.wire import (
    ROUTES,
    LiteLLMError,
    Route,
    backend_kwargs,
    backend_secrets,
    call_kwargs,
    error_from,
    log_scrubbed,
    openai_dict,
    to_json,
)
from kvmigrate.proxy.body import parse_body
from kvmigrate.proxy.errors import (
    JSON_CONTENT_TYPE,
    ProxyError,
    body_too_large,
    model_not_found,
    shown,
    sse_error_event,
    unauthorized,
)
from kvmigrate.wire.sse_frames import DONE, data_frame, event_frame

log = logging.getLogger("kvmigrate.litellm_bridge.gateway")
LITELLM_EXTRA = "pip install 'kvmigrate[litellm]'"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LiteLLMNotInstalled(RuntimeError):
    """A litellm backend is configured, and litellm does not import."""


def missing_litellm_message(backend: str) -> str:
    return f"backend '{backend}' is type litellm: {LITELLM_EXTRA}"


def litellm_problem(config: Config) -> str | None:
    """Why the proxy could not serve this config's litellm backends, without importing litellm
    (which takes seconds); None when there are none or litellm is installed."""
    names = [name for name, b in config.backends.items() if b.type == "litellm"]
    if names and importlib.util.find_spec("litellm") is None:
        return missing_litellm_message(names[0])
    return None


def load_litellm(backend: str) -> ModuleType:
    try:
        module = importlib.import_module("litellm")
    except ImportError as exc:
        detail = "" if exc.name == "litellm" else f" (litellm does not import: {exc})"
        raise LiteLLMNotInstalled(missing_litellm_message(backend) + detail) from None
    # No "Give Feedback / Get Help" banner on stdout with every error.
    module.__dict__["suppress_debug_info"] = True
    return module


class LiteLLMGateway:
    """One litellm backend, served in OpenAI's wire format on a loopback port."""

    def __init__(
        self,
        backend: BackendConfig,
        models: Iterable[str],
        max_body_bytes: int = 32 * 1024 * 1024,
        litellm: ModuleType | None = None,
    ) -> None:
        self.backend = backend
        self.models = tuple(dict.fromkeys(models))
        self.max_body_bytes = max_body_bytes
        self._litellm = litellm if litellm is not None else load_litellm(backend.name)
        self._kwargs = backend_kwargs(backend)
        self._secrets = backend_secrets(backend)
        self._key = Secret("kvmigrate-gateway-" + secrets.token_urlsafe(24))
        # Bound now, so the proxy's upstream knows the port before the loop runs.
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        port = self._socket.getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def upstream_config(self) -> BackendConfig:
        """The backend as the proxy's upstream sees it: OpenAI-compatible, on loopback."""
        return replace(
            self.backend,
            api_bases=(self.url,),
            api_key=self._key,
            type="openai",
            api_version=None,
            litellm_params={},
        )

    def app(self) -> web.Application:
        # The proxy sends it bodies as they are: nothing arriving here is inflated (aiohttp
        # would, as the bytes arrive, before the key is checked).
        app = web.Application(
            middlewares=[self._boundary],
            client_max_size=self.max_body_bytes,
            handler_args={"auto_decompress": False},
        )
        for path, route in ROUTES.items():
            app.router.add_post(f"/v1/{path}", self._handler(route))
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_route("*", "/{tail:.*}", self._unsupported)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, self._socket).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._socket.close()

    @web.middleware
    async def _boundary(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The loopback key first; every failure leaves as an OpenAI error envelope."""
        try:
            supplied = request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not self._key.matches(supplied):
                raise unauthorized("This endpoint serves kvmigrate's proxy only.")
            return await handler(request)
        except LiteLLMError as error:
            return error.response(error.headers)
        except ProxyError as error:
            return error.response()
        except web.HTTPRequestEntityTooLarge:
            return body_too_large(self.max_body_bytes).response()
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            what = f"gateway of {self.backend.name}: {request.method} {request.path}"
            log_scrubbed(what, exc, self._secrets)
            return ProxyError(500, "The litellm gateway failed.", "server_error").response()

    def _handler(self, route: Route) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._call(request, route)

        return handle

    async def _call(self, request: web.Request, route: Route) -> web.StreamResponse:
        body = parse_body(await request.read())
        if body.model not in self.models:
            raise model_not_found(body.model)
        kwargs = call_kwargs(route, body.data, self._kwargs)
        function = getattr(self._litellm, route.function)
        result: Any = None
        try:
            result = await function(**kwargs)
            if not kwargs.get("stream"):
                return web.Response(body=to_json(result), content_type=JSON_CONTENT_TYPE)
            chunks = aiter(result)
            # Before the status line: a failure here is still a proper error status.
            first = await anext(chunks, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await _aclose(result)
            raise error_from(exc, self.backend.name, self._secrets) from None
        try:
            return await self._relay(request, route, first, chunks)
        finally:
            await _aclose(result)  # a client gone mid-stream frees the provider's connection

    async def _relay(
        self, request: web.Request, route: Route, first: object, chunks: AsyncIterator[Any]
    ) -> web.StreamResponse:
        """Each chunk is written as it arrives; a failure mid-stream ends it with an error
        event, which the OpenAI SDKs raise."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if first is not None:
                await response.write(_event(route, first))
            async for chunk in chunks:
                await response.write(_event(route, chunk))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            error = error_from(exc, self.backend.name, self._secrets)
            await response.write(sse_error_event(error.message, error.code or "upstream_error"))
        else:
            if not route.named_events:
                await response.write(DONE)
        await response.write_eof()
        return response

    async def _list_models(self, _request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {"id": model, "object": "model", "created": created, "owned_by": "litellm"}
            for model in self.models
        ]
        return web.json_response({"object": "list", "data": data})

    async def _unsupported(self, request: web.Request) -> web.Response:
        raise ProxyError(
            404,
            f"{shown(request.method)} {shown(request.path)} is not supported by a litellm backend "
            f"(`{self.backend.name}`); it serves {', '.join('/v1/' + r for r in ROUTES)}.",
            code="unsupported_route",
        )


async def _aclose(stream: object) -> None:
    """Close a litellm stream (best effort): it holds the provider's connection."""
    close = getattr(stream, "aclose", None)
    if callable(close):
        with contextlib.suppress(Exception):
            await close()


def _event(route: Route, chunk: object) -> bytes:
    data = openai_dict(chunk)
    kind = data.get("type")
    if route.named_events and isinstance(kind, str):
        return event_frame(kind, orjson.dumps(data))
    return data_frame(orjson.dumps(data))


def open_gateways(config: Config) -> dict[str, LiteLLMGateway]:
    """A gateway per litellm backend (importing litellm), or none."""
    return {
        name: LiteLLMGateway(
            backend,
            (s for r in config.models if (s := r.served_name(name)) is not None),
            config.server.max_body_bytes,
        )
        for name, backend in config.backends.items()
        if backend.type == "litellm"
    }


def through_gateways(config: Config, gateways: dict[str, LiteLLMGateway]) -> Config:
    """The config with each litellm backend replaced by its loopback gateway."""
    if not gateways:
        return config
    backends = {
        name: gateways[name].upstream_config() if name in gateways else backend
        for name, backend in config.backends.items()
    }
    return replace(config, backends=backends)
