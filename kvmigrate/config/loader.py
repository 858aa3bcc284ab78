"""Reads `config.yaml` into `Config`, refusing unknown keys and bad values with their path."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from kvmigrate.config.errors import ConfigError
from kvmigrate.config.model import (
    BackendConfig,
    CacheCheckConfig,
    Config,
    ModelRoute,
    RecordConfig,
    RolloutConfig,
    ServerConfig,
)
from kvmigrate.config.reader import ENV_PREFIX, Section
from kvmigrate.config.secret import Secret
from kvmigrate.policies.gates import GateConfig, RollbackConfig

CONFIG_ENV_VAR = "KVMIGRATE_CONFIG"
DEFAULT_CONFIG_PATH = "config.yaml"
ROLLOUT_MODES = ("shadow", "split")
BACKEND_TYPES = ("openai", "azure", "litellm")
# What kvmigrate itself passes to litellm: from the backend's own keys or from the request.
LITELLM_OWN_PARAMS = {
    "api_key": "set `api_key` on the backend",
    "api_base": "set `api_base` on the backend",
    "base_url": "set `api_base` on the backend",
    "api_version": "set `api_version` on the backend",
    "model": "the model string comes from `models:`",
    "messages": "comes from the request",
    "input": "comes from the request",
    "prompt": "comes from the request",
    "stream": "comes from the request",
}
CONTENT_POLICIES = ("none", "redacted", "full")


def default_config_path(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Config:
    """Load and validate a config file. Every problem is raised as `ConfigError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read: {exc}") from None
    return parse_config(text, source, env)


def parse_config(
    text: str, source: str = "<config>", env: Mapping[str, str] | None = None
) -> Config:
    env = os.environ if env is None else env
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "", f"not valid YAML: {where}{problem}") from None
    root = Section(data, source, "", env)
    config = _config(root)
    root.finish()
    return config


def _config(root: Section) -> Config:
    server = _server(root.section("server"))
    backends = _backends(root.section("backends"))
    rollout = _rollout(root.section("rollout"), backends)
    models = _models(root, backends)
    record = _record(root.section("record"))
    cachecheck = _cachecheck(root.section("cachecheck"))
    return Config(root.source, server, backends, models, rollout, record, cachecheck)


def _cachecheck(s: Section) -> CacheCheckConfig:
    d = CacheCheckConfig()
    cachecheck = CacheCheckConfig(
        enabled=s.boolean("enabled", d.enabled),
        max_conversations=s.integer("max_conversations", d.max_conversations, 1),
        ttl_seconds=s.number("ttl_seconds", d.ttl_seconds, 1.0),
    )
    s.finish()
    return cachecheck


def _server(s: Section) -> ServerConfig:
    server = ServerConfig(
        host=s.string("host", "127.0.0.1"),
        port=s.integer("port", 4000, 0, 65535),
        master_key=s.secret("master_key"),
        admin_key=s.secret("admin_key"),
        max_body_bytes=s.integer("max_body_bytes", 32 * 1024 * 1024, 1024),
        body_timeout_seconds=s.number("body_timeout_seconds", 30.0, 0.1),
    )
    s.finish()
    return server


def _backends(s: Section) -> dict[str, BackendConfig]:
    backends = {name: _backend(name, s.child(name, s.raw(name))) for name in s.names()}
    if not backends:
        raise ConfigError(s.source, "backends", "at least one backend is required")
    return backends


def _backend(name: str, s: Section) -> BackendConfig:
    kind = s.choice("type", "openai", BACKEND_TYPES)
    backend = BackendConfig(
        name=name,
        api_bases=_api_bases(s, kind),
        api_key=s.secret("api_key"),
        connect_timeout=s.number("connect_timeout", 5.0, 0.001),
        read_timeout=s.number("read_timeout", 600.0, 0.001),
        max_connections=s.integer("max_connections", 1000, 1),
        type=kind,
        api_version=s.string("api_version", None),
        litellm_params=_litellm_params(s, kind),
    )
    if backend.type == "azure" and not backend.api_version:
        raise s.error("api_version", "is required for an azure backend, e.g. 2024-10-21")
    s.finish()
    return backend


def _api_bases(s: Section, kind: str) -> tuple[str, ...]:
    """The replica URLs. A litellm backend may leave `api_base` out (litellm then uses the
    provider's own endpoint), and takes at most one: litellm has no replica routing."""
    if kind == "litellm":
        raw = s.raw("api_base", None)
        if isinstance(raw, list):
            raise s.error("api_base", "a litellm backend takes one URL, not a list")
        return () if raw is None else (s.url("api_base", raw),)
    raw_base = s.raw("api_base")
    if isinstance(raw_base, list):
        if not raw_base:
            raise s.error("api_base", "the replica list is empty")
        return tuple(s.url(f"api_base[{i}]", item) for i, item in enumerate(raw_base))
    return (s.url("api_base", raw_base),)


def _litellm_params(s: Section, kind: str) -> dict[str, object]:
    """`litellm_params`: extra keyword arguments for litellm, only on a litellm backend.
    Strings of the form `os.environ/NAME` anywhere in it are read as secrets."""
    if s.raw("litellm_params", None) is None:
        return {}
    if kind != "litellm":
        raise s.error("litellm_params", "only a backend of `type: litellm` takes litellm_params")
    params = s.section("litellm_params")
    values: dict[str, object] = {}
    for key in params.names():
        if key in LITELLM_OWN_PARAMS:
            raise params.error(key, f"kvmigrate sets this itself: {LITELLM_OWN_PARAMS[key]}")
        values[key] = _litellm_value(params, key, params.raw(key, None))
    return values


def _litellm_value(s: Section, key: str, value: Any) -> object:
    if isinstance(value, dict):
        child = s.child(key, value)
        return {name: _litellm_value(child, name, child.raw(name, None)) for name in child.names()}
    if isinstance(value, list):
        return [_litellm_value(s, f"{key}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        return Secret(s.resolved(key, value))
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise s.error(key, f"expected a string, number, boolean, list or mapping, got {value!r}")


def _models(root: Section, backends: dict[str, BackendConfig]) -> tuple[ModelRoute, ...]:
    items = root.raw("models", [])
    if not isinstance(items, list):
        raise root.error("models", "expected a list of model entries")
    routes: list[ModelRoute] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        s = root.child("models", None).child(index, item)
        route = _model(s, backends)
        if route.model_name in seen:
            raise s.error("model_name", f"duplicate model_name {route.model_name!r}")
        seen.add(route.model_name)
        routes.append(route)
    return tuple(routes)


def _model(s: Section, backends: dict[str, BackendConfig]) -> ModelRoute:
    model_name = s.string("model_name")
    served: dict[str, str] = {}
    for key in s.names():
        if key == "model_name":
            continue
        if key not in backends:
            raise s.error(key, f"not a backend name; known backends: {', '.join(backends)}")
        served[key] = s.string(key)
    if not served:
        raise s.error("model_name", "names no backend model; add e.g. `hosted: <model>`")
    return ModelRoute(model_name=model_name, served=served)


def _rollout(s: Section, backends: dict[str, BackendConfig]) -> RolloutConfig:
    defaults = RolloutConfig()
    names = tuple(backends)
    rollout = RolloutConfig(
        primary=s.choice("primary", defaults.primary, names),
        candidate=s.choice("candidate", defaults.candidate, names),
        mode=s.choice("mode", defaults.mode, ROLLOUT_MODES),
        percent=s.number("percent", defaults.percent, 0.0, 100.0),
        shadow_sample=s.number("shadow_sample", defaults.shadow_sample, 0.0, 1.0),
        steps=_steps(s),
        state=s.string("state", defaults.state),
        salt=s.string("salt", defaults.salt),
        fallback=s.boolean("fallback", defaults.fallback),
        shadow_max_concurrency=s.integer(
            "shadow_max_concurrency", defaults.shadow_max_concurrency, 0
        ),
        noise_sample=s.number("noise_sample", defaults.noise_sample, 0.0, 1.0),
        noise_per_minute=s.number("noise_per_minute", defaults.noise_per_minute, 0.0),
        shadow_primary_failures=s.boolean(
            "shadow_primary_failures", defaults.shadow_primary_failures
        ),
        pinning=s.boolean("pinning", defaults.pinning),
        pin_ttl_seconds=s.number("pin_ttl_seconds", defaults.pin_ttl_seconds, 1.0),
        bake_seconds=s.number("bake_seconds", defaults.bake_seconds, 0.0),
        gates=_gates(s.section("gates")),
        auto_rollback=_auto_rollback(s.section("auto_rollback")),
    )
    if rollout.primary == rollout.candidate:
        raise s.error("candidate", "must differ from rollout.primary")
    _check_store_url(s, "state", rollout.state, ("sqlite", "redis", "rediss"))
    s.finish()
    return rollout


def _gates(s: Section) -> GateConfig:
    d = GateConfig()
    gates = GateConfig(
        min_conversations=s.integer("min_conversations", d.min_conversations, 0),
        min_requests=s.integer("min_requests", d.min_requests, 0),
        error_rate_margin=s.number("error_rate_margin", d.error_rate_margin, 0.0, 1.0),
        ttft_p95_slo_ms=s.optional_number("ttft_p95_slo_ms", d.ttft_p95_slo_ms, 0.0),
        ttft_p95_factor=s.number("ttft_p95_factor", d.ttft_p95_factor, 0.0),
        ttft_p95_floor_ms=s.number("ttft_p95_floor_ms", d.ttft_p95_floor_ms, 0.0),
        min_parity=s.optional_number("min_parity", d.min_parity, 0.0, 1.0),
        min_parity_samples=s.integer("min_parity_samples", d.min_parity_samples, 1),
        window_seconds=s.number("window_seconds", d.window_seconds, 1.0),
    )
    s.finish()
    return gates


def _auto_rollback(s: Section) -> RollbackConfig:
    d = RollbackConfig()
    rollback = RollbackConfig(
        enabled=s.boolean("enabled", d.enabled),
        window_seconds=s.number("window_seconds", d.window_seconds, 1.0),
        min_requests=s.integer("min_requests", d.min_requests, 1),
        max_error_rate=s.number("max_error_rate", d.max_error_rate, 0.0, 1.0),
        error_rate_margin=s.number("error_rate_margin", d.error_rate_margin, 0.0, 1.0),
        ttft_p95_factor=s.number("ttft_p95_factor", d.ttft_p95_factor, 1.0),
        ttft_p95_ms=s.optional_number("ttft_p95_ms", d.ttft_p95_ms, 0.0),
        ttft_floor_ms=s.number("ttft_floor_ms", d.ttft_floor_ms, 0.0),
        max_invalid_tool_call_rate=s.number(
            "max_invalid_tool_call_rate", d.max_invalid_tool_call_rate, 0.0, 1.0
        ),
        min_tool_calls=s.integer("min_tool_calls", d.min_tool_calls, 1),
    )
    s.finish()
    return rollback


def _steps(s: Section) -> tuple[float, ...]:
    raw = s.raw("steps", [10, 50, 100])
    if not isinstance(raw, list) or not raw:
        raise s.error("steps", "expected a non-empty list of percentages, e.g. [10, 50, 100]")
    steps: list[float] = []
    for index, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
            raise s.error(f"steps[{index}]", f"expected a percentage in (0, 100], got {value!r}")
        if steps and value <= steps[-1]:
            raise s.error(f"steps[{index}]", "steps must increase")
        steps.append(float(value))
    return tuple(steps)


def _record(s: Section) -> RecordConfig:
    defaults = RecordConfig()
    record = RecordConfig(
        enabled=s.boolean("enabled", defaults.enabled),
        db=s.string("db", defaults.db),
        content=s.choice("content", defaults.content, CONTENT_POLICIES),
        retention_days=s.integer("retention_days", defaults.retention_days, 1),
        workers=s.integer("workers", defaults.workers, 1, 64),
    )
    _check_store_url(s, "db", record.db, ("sqlite", "postgresql", "postgres"))
    s.finish()
    return record


def _check_store_url(s: Section, key: str, url: str, schemes: tuple[str, ...]) -> None:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in schemes:
        raise s.error(
            key,
            f"expected a URL starting with {' or '.join(s + '://' for s in schemes)}; got {url!r}",
        )
