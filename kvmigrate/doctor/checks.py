"""The doctor's checks of a vLLM (or any OpenAI-compatible) endpoint, each with its fix.

Every check sends the smallest request that proves the point and reads the server's own
answer: the model list, a chat call, the same long prefix twice, a tool call probe with
`tool_choice: auto`, a JSON-mode call. A failed check carries the exact `vllm serve` flag
that fixes it. Required checks are the ones whose failure breaks the migration (no answers,
no cache, nothing to measure the cache with, agents' tool calls refused); the others warn.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvmigrate.config import safe_text, safe_url
from kvmigrate.doctor.endpoint import Endpoint, Reply
from kvmigrate.doctor.families import tool_flags
from kvmigrate.doctor.responses_chain import NAME, check_responses_chain
from kvmigrate.doctor.result import CheckResult

# Long enough to span many KV blocks (16 or 32 tokens each) and OpenAI's 1,024-token minimum
# for prompt caching, short enough for a small --max-model-len (capped at a third of it).
PREFIX_WORDS = 1200
_SENTENCE = "The agent reads the file, then calls a tool and writes a short reply. "
_SENTENCE_WORDS = 15
_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass(slots=True)
class Diagnosis:
    base_url: str
    model: str | None = None
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def failed_required(self) -> list[CheckResult]:
        return [c for c in self.checks if c.required and c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed_required


@dataclass(frozen=True, slots=True)
class Expectations:
    """What the endpoint should offer: the model, and the hosted context it replaces."""

    model: str | None = None
    hosted_model: str | None = None
    hosted_context: int | None = None


@dataclass(slots=True)
class _Facts:
    """What earlier checks learned that later ones need."""

    model: str = ""
    names: tuple[str, ...] = ()  # served name, root (HF id or path): for the parser family
    max_model_len: int | None = None
    details_on: bool = False


def _chat(model: str, content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        **extra,
    }


async def check_models(endpoint: Endpoint, want: Expectations, facts: _Facts) -> CheckResult:
    try:
        reply = await endpoint.get("models")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return CheckResult(
            "reachable", "fail", True,
            safe_text(f"GET {endpoint.base_url}/models: {type(exc).__name__}: {exc}"),
            "start the server, or correct --base-url: it must end in /v1, "
            "e.g. http://HOST:8000/v1",
        )  # fmt: skip
    if reply.status == 401:
        return CheckResult(
            "reachable", "fail", True, "401: the server wants an API key",
            "pass --api-key (the key given to `vllm serve --api-key`)",
        )  # fmt: skip
    cards = reply.body.get("data") if isinstance(reply.body, dict) else None
    # Only model cards (objects) count: `{"data": [1, 2]}` is no model list.
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else None
    if not reply.ok or not cards:
        return CheckResult(
            "reachable", "fail", True, f"GET /models answered {reply.status}: {reply.text[:200]}",
            "point --base-url at an OpenAI-compatible server (vLLM: .../v1)",
        )  # fmt: skip
    served = {str(c.get("id")): c for c in cards}
    model = want.model or next(iter(served))
    if model not in served:
        return CheckResult(
            "reachable", "fail", True,
            f"serves {', '.join(served)}, not {model}",
            f"start vLLM with --served-model-name {model} (or pass one of the served names)",
        )  # fmt: skip
    card = served[model]
    facts.model = model
    facts.names = (model, str(card.get("root") or ""))
    length = card.get("max_model_len")
    facts.max_model_len = length if isinstance(length, int) else None
    return CheckResult("reachable", "pass", True, f"serves {', '.join(served)}")


async def check_chat(endpoint: Endpoint, facts: _Facts) -> tuple[CheckResult, Reply]:
    reply = await endpoint.post("chat/completions", _chat(facts.model, "Say hello.", 8))
    if reply.ok:
        return CheckResult("chat template", "pass", True, "a chat request works"), reply
    message = reply.error_message
    if "chat template" in message.lower() or "chat_template" in message.lower():
        fix = (
            "the tokenizer has no chat template: start vLLM with --chat-template "
            "/path/to/template.jinja (the model family's template)"
        )
    else:
        fix = "see the server's log for this request"
    return CheckResult(
        "chat template", "fail", True, f"chat answered {reply.status}: {message}", fix
    ), reply


def check_details(chat: Reply, facts: _Facts) -> CheckResult:
    usage = chat.body.get("usage") if isinstance(chat.body, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    facts.details_on = isinstance(details, dict) and "cached_tokens" in details
    if facts.details_on:
        return CheckResult(
            "prompt-token details", "pass", True, "usage.prompt_tokens_details.cached_tokens"
        )
    return CheckResult(
        "prompt-token details", "fail", True,
        "usage.prompt_tokens_details is null: cached tokens per request are invisible",
        "start vLLM with --enable-prompt-tokens-details",
    )  # fmt: skip


async def check_prefix_cache(endpoint: Endpoint, facts: _Facts) -> CheckResult:
    words = PREFIX_WORDS
    if facts.max_model_len:
        words = max(64, min(words, facts.max_model_len // 3))
    nonce = uuid.uuid4().hex  # first, so no earlier request shares a single block
    text = f"Doctor probe {nonce}. " + _SENTENCE * max(1, words // _SENTENCE_WORDS)
    body = _chat(facts.model, text, 1)
    before = await endpoint.counters()
    replies = [await endpoint.post("chat/completions", body) for _ in range(2)]
    after = await endpoint.counters()
    if not all(r.ok for r in replies):
        bad = next(r for r in replies if not r.ok)
        return CheckResult(
            "prefix caching", "fail", True,
            f"a {words}-word prompt answered {bad.status}: {bad.error_message}",
            "see the server's log (is --max-model-len very small?)",
        )  # fmt: skip
    cached = _cached_tokens(replies[1])
    hits = None
    if before is not None and after is not None and "vllm:prefix_cache_hits_total" in after:
        key = "vllm:prefix_cache_hits_total"
        hits = after[key] - before.get(key, 0.0)
    evidence = []
    if cached is not None:
        evidence.append(f"second request: {cached} cached of {_prompt_tokens(replies[1])}")
    if hits is not None:
        evidence.append(f"vllm:prefix_cache_hits_total +{hits:.0f}")
    if (cached or 0) > 0 or (hits or 0) > 0:
        return CheckResult("prefix caching", "pass", True, "; ".join(evidence))
    if cached is None and hits is None:
        return CheckResult(
            "prefix caching", "warn", True,
            "cannot tell: no cached_tokens in usage and no vllm:prefix_cache_hits_total",
            "start vLLM with --enable-prompt-tokens-details so the cache is visible",
        )  # fmt: skip
    return CheckResult(
        "prefix caching", "fail", True,
        "the same prefix twice was not cached (" + "; ".join(evidence) + ")",
        "start vLLM with --enable-prefix-caching (and without --no-enable-prefix-caching)",
    )  # fmt: skip


def _cached_tokens(reply: Reply) -> int | None:
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def _prompt_tokens(reply: Reply) -> int | None:
    usage = reply.body.get("usage") if isinstance(reply.body, dict) else None
    value = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return value if isinstance(value, int) else None


async def check_tools(endpoint: Endpoint, facts: _Facts) -> CheckResult:
    body = _chat(
        facts.model, "What is the weather in Paris?", 32,
        tools=[_WEATHER_TOOL], tool_choice="auto",
    )  # fmt: skip
    reply = await endpoint.post("chat/completions", body)
    if reply.ok:
        return CheckResult("tool calling", "pass", True, "tool_choice: auto is accepted")
    return CheckResult(
        "tool calling", "fail", True,
        f"tool_choice: auto answered {reply.status}: {reply.error_message}",
        f"start vLLM with {tool_flags(*facts.names)}",
    )  # fmt: skip


async def check_json_mode(endpoint: Endpoint, facts: _Facts) -> CheckResult:
    body = _chat(
        facts.model, 'Answer in JSON: {"ok": true}', 24,
        response_format={"type": "json_object"},
    )  # fmt: skip
    reply = await endpoint.post("chat/completions", body)
    fix = (
        "use a vLLM with structured outputs (v0.6+); pick the backend with "
        '--structured-outputs-config \'{"backend": "xgrammar"}\''
    )
    if not reply.ok:
        detail = f"response_format json_object answered {reply.status}: {reply.error_message}"
        return CheckResult("json mode", "fail", False, detail, fix)
    choice, content = _first_choice(reply.body)
    if choice.get("finish_reason") == "stop":
        try:
            json.loads(content)
        except ValueError:
            return CheckResult(
                "json mode", "fail", False, f"finished with invalid JSON: {content[:80]!r}", fix
            )
    return CheckResult("json mode", "pass", False, "response_format json_object is accepted")


def _first_choice(body: Any) -> tuple[dict[str, Any], str]:
    """The first choice of a chat answer and its message text; empty for any other shape (a
    server that is not quite OpenAI-compatible must fail a check, not crash the doctor)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        return {}, ""
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return choice, content if isinstance(content, str) else ""


def check_context(want: Expectations, facts: _Facts) -> CheckResult:
    length = facts.max_model_len
    if length is None:
        return CheckResult("max model len", "skip", False, "the model card has no max_model_len")
    if want.hosted_context is None:
        return CheckResult(
            "max model len", "pass", False, f"{length} tokens (no hosted context to compare)"
        )
    hosted = f"{want.hosted_model or 'the hosted model'}'s {want.hosted_context}"
    if length >= want.hosted_context:
        return CheckResult("max model len", "pass", False, f"{length} tokens >= {hosted}")
    return CheckResult(
        "max model len", "warn", False,
        f"{length} tokens < {hosted}: longer conversations get a 400 and fall back",
        f"start vLLM with --max-model-len {want.hosted_context} if the model and the KV "
        "cache allow it",
    )  # fmt: skip


async def _guarded(name: str, required: bool, check: Awaitable[CheckResult]) -> CheckResult:
    """A check whose request broke (a dropped connection, a timeout) fails with the reason,
    instead of ending the whole diagnosis with a traceback."""
    try:
        return await check
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        problem = safe_text(f"request failed: {type(exc).__name__}: {exc}")
        return CheckResult(name, "fail", required, problem)


async def diagnose(endpoint: Endpoint, want: Expectations) -> Diagnosis:
    """Run every check in order; a check that cannot run after an earlier failure is skipped."""
    result = Diagnosis(safe_url(endpoint.base_url))  # printed, and kept in JSON
    facts = _Facts()
    reachable = await check_models(endpoint, want, facts)
    result.checks.append(reachable)
    later = ("chat template", "prompt-token details", "prefix caching", "tool calling")
    if reachable.status == "fail":
        result.checks += [CheckResult(n, "skip", True, "not reachable") for n in later]
        return result
    result.model = facts.model
    try:
        chat, reply = await check_chat(endpoint, facts)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        problem = safe_text(f"request failed: {type(exc).__name__}: {exc}")
        chat = CheckResult(later[0], "fail", True, problem)
    result.checks.append(chat)
    if chat.status == "fail":
        result.checks += [CheckResult(n, "skip", True, "no chat answer") for n in later[1:]]
    else:
        result.checks.append(check_details(reply, facts))
        result.checks.append(
            await _guarded("prefix caching", True, check_prefix_cache(endpoint, facts))
        )
        result.checks.append(await _guarded("tool calling", True, check_tools(endpoint, facts)))
        result.checks.append(await _guarded("json mode", False, check_json_mode(endpoint, facts)))
        chain = check_responses_chain(endpoint, facts.model)
        result.checks.append(await _guarded(NAME, False, chain))
    result.checks.append(check_context(want, facts))
    return result
