"""One emulated backend's state and its generation step: model check, context check, prefix
cache, and the choices of an answer. Timing and transport live elsewhere."""

from __future__ import annotations

import random
import time

from kvmigrate.emulator.breakpoint_cache import BreakpointCache, Breakpoints
from kvmigrate.emulator.errors import EmulatorError, bad_request, model_not_found
from kvmigrate.emulator.latency import LatencyModel, PrefillEngine
from kvmigrate.emulator.outputs import Choice, Generation, ToolCall
from kvmigrate.emulator.parsing import GenerationRequest
from kvmigrate.emulator.prefix_cache import PrefixCache
from kvmigrate.emulator.response_store import ResponseStore
from kvmigrate.emulator.settings import EmulatorSettings
from kvmigrate.emulator.textgen import Sampling, answer_text, cut, json_text
from kvmigrate.emulator.tokens import tokenize
from kvmigrate.emulator.tools import ToolSpec, plan_calls, select_tools
from kvmigrate.emulator.wire import Dialect, make_dialect


class Backend:
    def __init__(self, settings: EmulatorSettings, rng: random.Random | None = None) -> None:
        self.settings = settings
        self.rng = rng or random.Random(settings.fault_seed or None)
        self.dialect: Dialect = make_dialect(settings, self.rng)
        latency = settings.latency_settings
        self.latency = LatencyModel(latency, settings.time_scale, self.rng)
        self.engine = PrefillEngine(latency.engine_concurrency)
        self.responses = ResponseStore(settings.responses_store)
        self.breakpoint_cache = BreakpointCache(
            settings.cache_min_tokens, settings.cache_capacity_tokens, settings.hosted_cache_ttl_s
        )
        if settings.profile == "vllm":
            self.cache = PrefixCache.vllm(settings.block_size, settings.cache_capacity_tokens)
        else:
            self.cache = PrefixCache.hosted(
                settings.cache_capacity_tokens, settings.hosted_cache_ttl_s
            )

    def check_model(self, model: str) -> None:
        if model not in self.settings.served_models:
            raise model_not_found(model)

    def _check_length(self, req: GenerationRequest) -> None:
        limit, prompt = self.settings.context_limit, len(req.prompt)
        if self.settings.profile == "anthropic":
            _check_anthropic_length(req, limit, self.settings.max_output_tokens)
            return
        if self.settings.profile == "hosted":
            if req.max_tokens is not None and req.max_tokens > self.settings.max_output_tokens:
                raise bad_request(
                    f"max_tokens is too large: {req.max_tokens}. This model supports at most "
                    f"{self.settings.max_output_tokens} completion tokens, whereas you provided "
                    f"{req.max_tokens}.",
                    param="max_tokens",
                    code="invalid_value",
                )
            if prompt > limit:
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"messages resulted in {prompt} tokens. Please reduce the length of the "
                    "messages.",
                    param="messages",
                    code="context_length_exceeded",
                )
            return
        wanted = prompt + (req.max_tokens or 1)
        if wanted > limit:
            raise EmulatorError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {wanted} tokens ({prompt} in the messages, {req.max_tokens or 0} "
                "in the completion). Please reduce the length of the messages or completion.",
                code="context_length_exceeded",
            )

    def generate(
        self, req: GenerationRequest, *, chat: bool = True, breakpoints: Breakpoints | None = None
    ) -> Generation:
        """`breakpoints`: a Messages request's; on the anthropic profile only they cache."""
        self.check_model(req.model)
        self._check_length(req)
        written = 0
        if self.settings.profile == "anthropic":
            use = self.breakpoint_cache.lookup_and_insert(
                req.prompt, breakpoints or Breakpoints(), salt=req.model
            )
            cached, written = use.read, use.written
        else:
            cached = self.cache.lookup_and_insert(req.prompt, salt=req.model).cached_tokens
        family = self.settings.answer_family or f"{self.settings.profile}|{req.model}"
        key = f"{family}|{req.prompt_key}"
        choices = tuple(self._choice(req, key, index) for index in range(req.n))
        return Generation(
            id=self.dialect.chat_id() if chat else self.dialect.completion_id(),
            created=int(time.time()),
            model=req.model,
            prompt_tokens=len(req.prompt),
            cached_tokens=cached,
            choices=choices,
            cache_written=written,
        )

    def _choice(self, req: GenerationRequest, key: str, index: int) -> Choice:
        sampling = Sampling(
            key, req.seed, req.temperature, self.settings.noise, index, req.noise_seed
        )
        selected = select_tools(req.tools, req.last_role, req.topic_text)
        if selected:
            return self._tool_choice(req, sampling, index, selected)
        if req.json_mode:
            text = json_text(req.topic_text, req.json_schema, sampling)
        else:
            low = self.settings.min_output_tokens
            text = answer_text(
                req.topic_text, sampling, low, self.settings.max_output_tokens_default
            )
        result = cut(text, req.max_tokens, req.stop)
        return Choice(index, result.pieces, result.finish_reason, result.stop_reason)

    def _tool_choice(
        self, req: GenerationRequest, sampling: Sampling, index: int, selected: list[ToolSpec]
    ) -> Choice:
        planned = plan_calls(selected, req.topic_text, sampling.base_rng())
        calls = tuple(ToolCall(self.dialect.tool_call_id(), p.name, p.arguments) for p in planned)
        if self.settings.broken_tool_calls and self.rng.random() < self.settings.broken_tool_calls:
            calls = tuple(_broken(call) for call in calls)
        pieces = tuple(tuple(tokenize(c.arguments)) for c in calls)
        return Choice(index, (), "tool_calls", None, calls, pieces)


def _check_anthropic_length(req: GenerationRequest, limit: int, max_output: int) -> None:
    """Anthropic's 400s, worded as its API words them."""
    if req.max_tokens is not None and req.max_tokens > max_output:
        raise bad_request(
            f"max_tokens: {req.max_tokens} > {max_output}, which is the maximum allowed "
            f"number of output tokens for {req.model}"
        )
    if len(req.prompt) + (req.max_tokens or 0) > limit:
        raise bad_request(f"prompt is too long: {len(req.prompt)} tokens > {limit} maximum")


def _broken(call: ToolCall) -> ToolCall:
    """What a misconfigured tool parser produces: a mangled name and arguments cut short."""
    return ToolCall(
        call.id, call.name + "_call", call.arguments[: max(1, len(call.arguments) // 2)]
    )
