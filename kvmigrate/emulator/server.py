"""Routes of an emulated backend, and `build_app(settings)`, the aiohttp application factory.

Middlewares, outermost first: errors (any `EmulatorError` becomes the profile's error
envelope), auth (`--api-key` guards `/v1/*`), faults (header and random faults; status, hang
and slow-first-byte faults act here, mid-body faults in `transport`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web

from kvmigrate.emulator.backend import Backend
from kvmigrate.emulator.dcgm import GPU_CLOCK, GpuClock, dcgm_metrics
from kvmigrate.emulator.dcgm import PATH as DCGM_PATH
from kvmigrate.emulator.embeddings import embed, encode
from kvmigrate.emulator.errors import EmulatorError, bad_request, model_not_found, unauthorized
from kvmigrate.emulator.faults import FAULT_HEADER, combine, draw_faults, parse_fault_header
from kvmigrate.emulator.input_items import own_items, page
from kvmigrate.emulator.messages_api import Flavor, MessagesRenderer, count_tokens_body
from kvmigrate.emulator.messages_request import parse_messages
from kvmigrate.emulator.metrics import CONTENT_TYPE, EmulatorMetrics
from kvmigrate.emulator.outputs import Generation
from kvmigrate.emulator.parsing import (
    NOISE_SEED_HEADER,
    GenerationRequest,
    parse_chat,
    parse_completion,
    require_model,
    require_object,
)
from kvmigrate.emulator.responses_api import ResponseRenderer, parse_responses
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.tokens import count_tokens
from kvmigrate.emulator.transport import (
    FAULT_PLAN,
    SHUTDOWN,
    Frame,
    data_frame,
    event_frame,
    pause,
    send_json,
    send_misframed,
    send_stream,
)
from kvmigrate.emulator.wire import JSON, Step
from kvmigrate.serving import run_app_forever

BACKEND: web.AppKey[Backend] = web.AppKey("emulator_backend", Backend)
METRICS: web.AppKey[EmulatorMetrics] = web.AppKey("emulator_metrics", EmulatorMetrics)
Handler = Callable[[web.Request], Any]
MAX_BODY_BYTES = 64 * 1024 * 1024
_BAD_JSON = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON.)"
)
_FAULT_MESSAGES = {
    429: "Rate limit reached for requests. Please try again later.",
    500: "The server had an error while processing your request. Sorry about that!",
    503: "The server is overloaded or not ready yet.",
}


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = request.app[BACKEND].dialect
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except EmulatorError as error:
        return await send_json(request, dialect.error_body(error), error.status, error.headers)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as unrouted:
        return await _unrouted(request, unrouted.status)


async def _unrouted(request: web.Request, status: int) -> web.StreamResponse:
    """A path no route serves (404), or a method its route does not take (405), as each
    server words it: aiohttp's own answer is plain text, which no SDK reads as an error."""
    backend = request.app[BACKEND]
    phrase = HTTPStatus(status).phrase
    if backend.settings.profile == "vllm":  # FastAPI's default
        return web.json_response({"detail": phrase}, status=status)
    if backend.settings.profile == "anthropic":
        message = phrase
    elif status == 404:
        message = f"Invalid URL ({request.method} {request.path})"
    else:
        message = f"Invalid method for URL ({request.method} {request.path})"
    return await send_json(
        request, backend.dialect.error_body(EmulatorError(status, message)), status
    )


@web.middleware
async def _auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings = request.app[BACKEND].settings
    key = settings.api_key
    if settings.azure and request.path.startswith("/openai/"):
        if not request.query.get("api-version"):
            raise bad_request("Missing required query parameter 'api-version'.", "api-version")
        # Azure OpenAI authenticates with the `api-key` header.
        if key and request.headers.get("api-key", "") != key:
            raise unauthorized(request.headers.get("api-key") or None)
    elif settings.profile == "anthropic" and request.path.startswith("/v1"):
        _anthropic_auth(request, key)
    elif key and request.path.startswith("/v1"):
        supplied = request.headers.get("Authorization", "")
        token = supplied[7:] if supplied.lower().startswith("bearer ") else ""
        if token != key:
            raise unauthorized(token or None)
    response: web.StreamResponse = await handler(request)
    return response


def _anthropic_auth(request: web.Request, key: str | None) -> None:
    """Anthropic's API reads the key from `x-api-key`, or as a Bearer token (what the
    anthropic SDK sends for `api_key` since 2.x), and wants `anthropic-version`."""
    supplied = request.headers.get("x-api-key", "")
    bearer = request.headers.get("Authorization", "")
    if bearer.lower().startswith("bearer "):
        supplied = supplied or bearer[7:]
    if key and supplied != key:
        raise EmulatorError(
            401, "invalid x-api-key" if supplied else "x-api-key header is required"
        )
    if not request.headers.get("anthropic-version"):
        raise bad_request("anthropic-version: header is required")


@web.middleware
async def _faults(request: web.Request, handler: Handler) -> web.StreamResponse:
    backend = request.app[BACKEND]
    settings = backend.settings
    try:
        aimed = parse_fault_header(request.headers.get(FAULT_HEADER, ""), settings.instance_name)
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    plan = combine(draw_faults(settings.faults, backend.rng), aimed)
    request[FAULT_PLAN] = plan
    if plan.names:
        request.app[METRICS].faults(plan.names)
    await pause(request, plan.slow_first_byte_s)
    if plan.hang:
        await pause(request, float("inf"))
        raise EmulatorError(503, _FAULT_MESSAGES[503])
    if plan.status is not None:
        headers = {"Retry-After": f"{plan.retry_after_s:g}"} if plan.status == 429 else None
        message = _FAULT_MESSAGES.get(plan.status, f"Injected fault {plan.status}.")
        code = "rate_limit_exceeded" if plan.status == 429 else None
        raise EmulatorError(plan.status, message, code=code, headers=headers)
    if plan.misframed is not None:
        return await send_misframed(request, plan.misframed)
    response: web.StreamResponse = await handler(request)
    return response


async def _read_json(request: web.Request) -> Any:
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        raise bad_request(_BAD_JSON) from None
    deployment = request.match_info.get("deployment")
    if deployment is not None and isinstance(body, dict):
        # Azure OpenAI: the deployment in the URL names the model; `model` is ignored.
        body["model"] = deployment
    return body


async def _read_messages_json(request: web.Request) -> Any:
    """A Messages request's body. Anthropic's API parses it strictly (an escaped lone
    surrogate is refused) and words the refusal its own way, the parser's reason included;
    vLLM's Messages route reads it as its OpenAI routes do."""
    if request.app[BACKEND].settings.profile != "anthropic":
        return await _read_json(request)
    try:
        return orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None


async def _deliver(
    request: web.Request,
    req: GenerationRequest,
    gen: Generation,
    body: Callable[[], JSON],
    steps: Callable[[], Iterable[Step]],
    frame: Frame = data_frame,
    done: bool = True,
) -> web.StreamResponse:
    """Wait for prefill, then send the answer as one body or as a paced stream."""
    backend, metrics = request.app[BACKEND], request.app[METRICS]
    started = time.perf_counter()
    metrics.prompt(gen.prompt_tokens, gen.cached_tokens)
    prefill_s = backend.latency.prefill_s(gen.prompt_tokens, gen.cached_tokens)
    gap_s = backend.latency.token_gap_s()
    held = gen.prompt_tokens + gen.completion_tokens
    async with backend.engine.admitted(prefill_s, held):
        if req.stream:

            def first_token() -> None:
                metrics.first_token(time.perf_counter() - started)

            response = await send_stream(request, steps(), gap_s, frame, done, first_token)
        else:
            metrics.first_token(time.perf_counter() - started)
            decode_steps = max(c.completion_tokens for c in gen.choices) - 1
            if gap_s > 0 and decode_steps > 0:
                await asyncio.sleep(gap_s * decode_steps)
            response = await send_json(request, body())
    reasons = [c.finish_reason for c in gen.choices]
    metrics.finished(gen.completion_tokens, reasons, time.perf_counter() - started)
    return response


def _noise_seeded(request: web.Request, req: GenerationRequest) -> GenerationRequest:
    """`x-emulator-noise-seed: N` seeds the noise stream of an unseeded call (a whole number;
    anything else is ignored, as a real backend ignores a header it does not know)."""
    value = request.headers.get(NOISE_SEED_HEADER, "")
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        return req
    return dataclasses.replace(req, noise_seed=int(value))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    req = _noise_seeded(request, parse_chat(await _read_json(request)))
    gen = backend.generate(req, chat=True)
    dialect = backend.dialect
    return await _deliver(
        request,
        req,
        gen,
        lambda: dialect.chat_completion(gen),
        lambda: dialect.chat_chunks(gen, req.include_usage),
    )


async def completions(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    req = _noise_seeded(request, parse_completion(await _read_json(request)))
    gen = backend.generate(req, chat=False)
    dialect = backend.dialect
    return await _deliver(
        request,
        req,
        gen,
        lambda: dialect.completion(gen),
        lambda: dialect.completion_chunks(gen, req.include_usage),
    )


async def responses(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    body = await _read_json(request)
    req, echo, conversation = parse_responses(body, backend.responses.history)
    gen = backend.generate(req, chat=True)
    renderer = ResponseRenderer(gen, echo, backend.dialect)
    if echo.get("store") is not False:
        final = renderer.response(renderer.final_status())
        items = backend.responses.context(echo.get("previous_response_id"))
        items += own_items(body, lambda: backend.dialect.hex(48))
        backend.responses.keep(renderer.id, conversation + renderer.as_messages(), final, items)
    return await _deliver(
        request,
        req,
        gen,
        lambda: renderer.response(renderer.final_status()),
        renderer.events,
        frame=event_frame,
        done=False,
    )


async def get_response(request: web.Request) -> web.StreamResponse:
    stored = request.app[BACKEND].responses.response(request.match_info["id"])
    return await send_json(request, stored)


async def list_input_items(request: web.Request) -> web.StreamResponse:
    items = request.app[BACKEND].responses.input_items(request.match_info["id"])
    return await send_json(request, page(items, request.query))


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API: the anthropic profile's one route, and vLLM's too."""
    backend = request.app[BACKEND]
    try:
        req, breakpoints = parse_messages(await _read_messages_json(request))
        gen = backend.generate(req, chat=True, breakpoints=breakpoints)
    except EmulatorError as error:
        return await _messages_error(request, error)
    renderer = MessagesRenderer(gen, backend.settings)
    return await _deliver(
        request, req, gen, renderer.message, renderer.events, frame=event_frame, done=False
    )


async def count_message_tokens(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    try:
        req, _ = parse_messages(await _read_messages_json(request), count_only=True)
        backend.check_model(req.model)
    except EmulatorError as error:
        return await _messages_error(request, error)
    flavor: Flavor = "anthropic" if backend.settings.profile == "anthropic" else "vllm"
    return await send_json(request, count_tokens_body(len(req.prompt), flavor))


async def _messages_error(request: web.Request, error: EmulatorError) -> web.StreamResponse:
    """vLLM answers a Messages request's errors in Anthropic's envelope, its exception class
    name for the type (vllm/entrypoints/anthropic/api_router.py translate_error_response)."""
    backend = request.app[BACKEND]
    if backend.settings.profile == "anthropic":
        raise error
    phrase = HTTPStatus(error.status).phrase.replace(" ", "").replace("-", "")
    inner = {"type": f"{phrase}Error", "message": error.vllm_message or error.message}
    return await send_json(request, {"type": "error", "error": inner}, error.status)


def _embedding_inputs(body: JSON) -> list[str]:
    raw = body.get("input")
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw and all(isinstance(i, str) for i in raw):
        return list(raw)
    if isinstance(raw, list) and raw and all(isinstance(i, int) for i in raw):
        return [" ".join(map(str, raw))]
    if isinstance(raw, list) and raw and all(isinstance(i, list) for i in raw):
        return [" ".join(map(str, tokens)) for tokens in raw]
    raise bad_request("Invalid 'input': expected a string, strings or token arrays.", "input")


async def embeddings(request: web.Request) -> web.StreamResponse:
    backend = request.app[BACKEND]
    body = require_object(await _read_json(request))
    model = require_model(body)
    backend.check_model(model)
    texts = _embedding_inputs(body)
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad_request("Invalid 'encoding_format': expected float or base64.", "encoding_format")
    dimensions = body.get("dimensions") or backend.settings.embedding_dimensions
    if not isinstance(dimensions, int) or dimensions < 1:
        raise bad_request("Invalid 'dimensions': expected a positive integer.", "dimensions")
    data = [
        {"object": "embedding", "index": i, "embedding": encode(embed(t, dimensions), fmt)}
        for i, t in enumerate(texts)
    ]
    tokens = sum(count_tokens(t) for t in texts)
    async with backend.engine.admitted(backend.latency.prefill_s(tokens, 0)):
        return await send_json(request, backend.dialect.embeddings(model, data, tokens))


async def list_models(request: web.Request) -> web.StreamResponse:
    return await send_json(request, request.app[BACKEND].dialect.model_list())


async def get_model(request: web.Request) -> web.StreamResponse:
    listing = request.app[BACKEND].dialect.model_list()
    for card in listing["data"]:
        if card["id"] == request.match_info["model"]:
            return await send_json(request, card)
    raise model_not_found(request.match_info["model"])


async def health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


async def metrics(request: web.Request) -> web.StreamResponse:
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def reset_prefix_cache(request: web.Request) -> web.StreamResponse:
    """vLLM's development endpoint (served with VLLM_SERVER_DEV_MODE=1): empties the prefix
    cache, so a benchmark can start each workload cold. The emulator holds no blocks for
    running requests, so the reset always succeeds."""
    request.app[BACKEND].cache.clear()
    return web.json_response({"success": True})


async def _wake_sleepers(app: web.Application) -> None:
    app[SHUTDOWN].set()


def build_app(settings: EmulatorSettings) -> web.Application:
    """An aiohttp application emulating one backend as `settings` describe."""
    backend = Backend(settings)
    app = web.Application(middlewares=[_errors, _auth, _faults], client_max_size=MAX_BODY_BYTES)
    app[BACKEND] = backend
    app[METRICS] = EmulatorMetrics(settings, backend.engine)
    app[SHUTDOWN] = asyncio.Event()
    app.on_shutdown.append(_wake_sleepers)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_message_tokens)
    if settings.profile != "anthropic":
        app.router.add_post("/v1/chat/completions", chat_completions)
        app.router.add_post("/v1/completions", completions)
        app.router.add_post("/v1/responses", responses)
        app.router.add_get("/v1/responses/{id}", get_response)
        app.router.add_get("/v1/responses/{id}/input_items", list_input_items)
        app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    if settings.profile == "vllm":
        app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
        app[GPU_CLOCK] = GpuClock(backend.engine)
        app.router.add_get(DCGM_PATH, dcgm_metrics)
    if settings.azure:
        # Azure OpenAI's URL shape: /openai/deployments/{deployment}/...?api-version=...
        azure = "/openai/deployments/{deployment}"
        app.router.add_post(f"{azure}/chat/completions", chat_completions)
        app.router.add_post(f"{azure}/completions", completions)
        app.router.add_post(f"{azure}/embeddings", embeddings)
        # Azure's "Models - List": what the proxy asks to verify a passed-through key.
        app.router.add_get("/openai/models", list_models)
    return app


def serve(settings: EmulatorSettings, host: str, port: int) -> None:
    """Serve an emulator in the foreground until SIGINT or SIGTERM."""
    models = ", ".join(settings.served_models)
    banner = (
        f"kvmigrate emulator {settings.instance_name!r} ({settings.profile}) serving {models} "
        f"on http://{host}:{port}/v1 (time scale {settings.time_scale:g})"
    )
    run_app_forever(build_app(settings), host, port, banner)
