"""Reads `config.yaml` into `Config`, refusing unknown keys and bad values with their path."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from kvmigrate.config.cohorts import read_candidates, read_cohorts
from kvmigrate.config.errors import ConfigError, shown
from kvmigrate.config.model import (
    MODEL_NAME_MAX_CHARS,
    NAME_MAX_CHARS,
    NO_MESSAGES_TYPES,
    BackendConfig,
    CacheCheckConfig,
    Config,
    GpuConfig,
    ModelRoute,
    RecordConfig,
    RolloutConfig,
    ServerConfig,
)
from kvmigrate.config.reader import ENV_PREFIX, Section
from kvmigrate.config.schema import default_of, read_field, read_struct
from kvmigrate.config.secret import Secret
from kvmigrate.config.strict_yaml import read_yaml
from kvmigrate.credential_names import is_credential_header

CONFIG_ENV_VAR = "KVMIGRATE_CONFIG"
DEFAULT_CONFIG_PATH = "config.yaml"
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an RFC 9110 token
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


def default_config_path(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(CONFIG_ENV_VAR) or DEFAULT_CONFIG_PATH


def load_config(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    secrets_required: bool = True,
) -> Config:
    """Load and validate a config file. Every problem is raised as `ConfigError`.
    `secrets_required=False`: an `os.environ/` secret whose variable is unset loads as an
    `UnsetSecret`, for commands that never use one."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        # The first command a new user runs in a new directory lands here.
        raise ConfigError(
            source, "", 'file not found: run "kvmigrate init" to write one, or pass --config'
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read: {exc}") from None
    return parse_config(text, source, env, secrets_required)


def parse_config(
    text: str,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    secrets_required: bool = True,
) -> Config:
    env = os.environ if env is None else env
    root = Section(read_yaml(text, source), source, "", env, secrets_required)
    config = _config(root)
    root.finish()
    return config


def _config(root: Section) -> Config:
    server = read_struct(root.section("server"), ServerConfig)
    backends = _backends(root.section("backends"))
    rollout = _rollout(root.section("rollout"), backends)
    models = _models(root, backends, rollout)
    record = _record(root.section("record"))
    cachecheck = read_struct(root.section("cachecheck"), CacheCheckConfig)
    cohorts = read_cohorts(root, models, _steps, rollout.primary)
    config = Config(
        root.source, server, backends, models, rollout, record, cachecheck, cohorts=cohorts
    )
    gpu = _gpu(root.section("gpu"), config)
    return msgspec.structs.replace(config, gpu=gpu)


# A PromQL query longer than this is no query an operator wrote by hand.
PROMQL_MAX_CHARS = 2048


def _gpu(s: Section, config: Config) -> GpuConfig:
    """The `gpu:` section: every URL an http(s) one, each `metrics_urls` key a candidate."""
    candidates = config.candidate_backends()
    urls: dict[str, tuple[str, ...]] = {}
    named = s.section("metrics_urls")
    for name in named.names():
        if name not in candidates:
            known = ", ".join(candidates)
            raise named.error(name, f"not a candidate backend; the candidates are: {known}")
        urls[name] = _url_list(named, name)
    named.finish()
    raw_prometheus = s.raw("prometheus_url", None)
    prometheus = None if raw_prometheus is None else s.url("prometheus_url", raw_prometheus)
    query = s.string("prometheus_query", default_of(GpuConfig, "prometheus_query"))
    if not query.strip() or len(query) > PROMQL_MAX_CHARS or not query.isprintable():
        raise s.error(
            "prometheus_query",
            f"expected one line of PromQL, at most {PROMQL_MAX_CHARS} characters",
        )
    given = {
        "metrics_urls": urls,
        "dcgm_urls": _url_list(s, "dcgm_urls") if s.has("dcgm_urls") else (),
        "prometheus_url": prometheus,
        "prometheus_query": query,
    }
    gpu = read_struct(s, GpuConfig, given)
    if gpu.dcgm_urls and gpu.prometheus_url:
        raise s.error("prometheus_url", "give dcgm_urls or prometheus_url, not both")
    sources = [k for k in ("metrics_urls", "dcgm_urls", "prometheus_url") if getattr(gpu, k)]
    if sources and not gpu.scrape:
        raise s.error(sources[0], "is scraped only with `scrape: true`")
    if gpu.scrape and not config.record.enabled:
        raise s.error("scrape", "needs record.enabled: the samples are stored with the records")
    return gpu


def _url_list(s: Section, key: str) -> tuple[str, ...]:
    raw = s.raw(key)
    if not isinstance(raw, list) or not raw:
        raise s.error(key, "expected a non-empty list of http(s) URLs")
    return tuple(s.url(f"{key}[{i}]", item) for i, item in enumerate(raw))


def _backends(s: Section) -> dict[str, BackendConfig]:
    backends: dict[str, BackendConfig] = {}
    for name in s.names():
        s.checked(name, name, NAME_MAX_CHARS, spaces=True)  # it labels metrics and logs
        backends[name] = _backend(name, s.child(name, s.raw(name)))
    if not backends:
        raise ConfigError(s.source, "backends", "at least one backend is required")
    return backends


def _backend(name: str, s: Section) -> BackendConfig:
    kind = read_field(s, BackendConfig, "type")
    given = {
        "name": name,
        "type": kind,
        "api_bases": _api_bases(s, kind),
        "litellm_params": _litellm_params(s, kind),
        "candidate_headers": _header_names(s, "candidate_headers"),
    }
    backend = read_struct(s, BackendConfig, given)
    if backend.type == "azure" and not backend.api_version:
        raise s.error("api_version", "is required for an azure backend, e.g. 2024-10-21")
    return backend


def _header_names(s: Section, key: str) -> tuple[str, ...]:
    """A list of HTTP header names (RFC 9110 tokens), lower-cased; none that may carry a
    credential, which the candidate must never get."""
    raw = s.raw(key, [])
    if not isinstance(raw, list):
        raise s.error(key, "expected a list of header names")
    for i, item in enumerate(raw):
        if not isinstance(item, str) or not HEADER_NAME.fullmatch(item):
            raise s.error(f"{key}[{i}]", f"not an HTTP header name: {shown(item)}")
        if is_credential_header(item):
            raise s.error(
                f"{key}[{i}]",
                f"{shown(item)} may carry a credential (its name says so), and a candidate "
                "never gets a client's credentials; give the backend its own `api_key`",
            )
    return tuple(item.lower() for item in raw)


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
    done: dict[int, object] = {}
    for key in params.names():
        if key in LITELLM_OWN_PARAMS:
            raise params.error(key, f"kvmigrate sets this itself: {LITELLM_OWN_PARAMS[key]}")
        values[key] = _litellm_value(params, key, params.raw(key, None), done)
    return values


def _litellm_value(s: Section, key: str, value: Any, done: dict[int, object]) -> object:
    """`value` with its secrets read. A YAML alias makes one list or mapping appear in many
    places: each is read once (`done`, by identity), or aliases of aliases (a billion-laughs
    file) took exponential time."""
    if isinstance(value, dict | list) and id(value) in done:
        return done[id(value)]
    if isinstance(value, dict):
        child = s.child(key, value)
        read = {n: _litellm_value(child, n, child.raw(n, None), done) for n in child.names()}
        done[id(value)] = read
        return read
    if isinstance(value, list):
        items = [_litellm_value(s, f"{key}[{i}]", item, done) for i, item in enumerate(value)]
        done[id(value)] = items
        return items
    if isinstance(value, str) and value.startswith(ENV_PREFIX):
        return Secret(s.resolved(key, value))
    if value is None or isinstance(value, str | int | float | bool):
        return value
    raise s.error(key, f"expected a string, number, boolean, list or mapping, got {shown(value)}")


def _models(
    root: Section, backends: dict[str, BackendConfig], rollout: RolloutConfig
) -> tuple[ModelRoute, ...]:
    items = root.raw("models", [])
    if not isinstance(items, list):
        raise root.error("models", "expected a list of model entries")
    routes: list[ModelRoute] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        s = root.child("models", None).child(index, item)
        route = _model(s, backends, rollout)
        if route.model_name in seen:
            raise s.error(
                "model_name", f"duplicate model_name {s.quoted('model_name', route.model_name)}"
            )
        seen.add(route.model_name)
        routes.append(route)
    return tuple(routes)


def _model(s: Section, backends: dict[str, BackendConfig], rollout: RolloutConfig) -> ModelRoute:
    model_name = s.name("model_name", MODEL_NAME_MAX_CHARS)
    served: dict[str, str] = {}
    for key in s.names():
        if key in ("model_name", "candidates"):
            continue
        if key not in backends:
            raise s.error(key, f"not a backend name; known backends: {', '.join(backends)}")
        served[key] = s.name(key, MODEL_NAME_MAX_CHARS)
    if not served:
        raise s.error("model_name", "names no backend model; add e.g. `hosted: <model>`")
    _check_messages_capable(s, backends, served)
    candidates = read_candidates(s, served)
    _check_answered_by_primary_or_candidate(s, served, candidates, rollout)
    return ModelRoute(model_name=model_name, served=served, candidates=candidates)


def _check_answered_by_primary_or_candidate(
    s: Section, served: dict[str, str], candidates: tuple[str, ...], rollout: RolloutConfig
) -> None:
    """A model the primary does not serve is answered by its candidate alone, in every
    mode (there is nothing to shadow or fall back to). A further backend of such a model
    would never be called, and the candidate would answer clients in shadow mode where the
    config reads as if that backend did: refused now."""
    if rollout.primary in served:
        return
    allowed = set(candidates) or {rollout.candidate}
    for name in served:
        if name not in allowed:
            backend, primary = shown(name), shown(rollout.primary)
            raise s.error(
                name,
                f"backend {backend} is neither the rollout's primary ({primary}) nor a "
                "candidate of this model; a model the primary does not serve is answered by "
                f"its candidate alone, so {backend} would never be called. Map the model to "
                f"{primary} too, or list {backend} in this model's `candidates`",
            )


def _check_messages_capable(
    s: Section, backends: dict[str, BackendConfig], served: dict[str, str]
) -> None:
    """A model on an `anthropic` backend is reached with Anthropic's Messages API, which
    Azure OpenAI and the litellm gateway do not serve: routing it there is refused now,
    not at its first request."""
    types = {name: backends[name].type for name in served}
    anthropic = next((n for n, t in types.items() if t == "anthropic"), None)
    if anthropic is None:
        return
    for name, kind in types.items():
        if kind in NO_MESSAGES_TYPES:
            raise s.error(
                name,
                f"backend {shown(name)} (type {kind}) cannot serve Anthropic's Messages API, which "
                f"this model is served with on backend {shown(anthropic)} (type anthropic); "
                "kvmigrate does not translate between the two APIs",
            )


def _rollout(s: Section, backends: dict[str, BackendConfig]) -> RolloutConfig:
    names = tuple(backends)
    steps = _steps(s, default_of(RolloutConfig, "steps"))
    rollout = read_struct(
        s, RolloutConfig, {"steps": steps}, choices={"primary": names, "candidate": names}
    )
    if rollout.primary == rollout.candidate:
        raise s.error("candidate", "must differ from rollout.primary")
    _check_store_url(s, "state", rollout.state, ("sqlite", "redis", "rediss"))
    return rollout


def _steps(s: Section, default: tuple[float, ...]) -> tuple[float, ...]:
    raw = s.raw("steps", None)
    if raw is None:
        return default
    if not isinstance(raw, list) or not raw:
        raise s.error("steps", "expected a non-empty list of percentages, e.g. [10, 50, 100]")
    steps: list[float] = []
    for index, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 100:
            raise s.error(
                f"steps[{index}]", f"expected a percentage in (0, 100], got {shown(value)}"
            )
        if steps and value <= steps[-1]:
            raise s.error(f"steps[{index}]", "steps must increase")
        steps.append(float(value))
    return tuple(steps)


def _record(s: Section) -> RecordConfig:
    record = read_struct(s, RecordConfig)
    _check_store_url(s, "db", record.db, ("sqlite", "postgresql", "postgres"))
    return record


def _check_store_url(s: Section, key: str, url: str, schemes: tuple[str, ...]) -> None:
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in schemes:
        expected = " or ".join(s + "://" for s in schemes)
        raise s.error(key, f"expected a URL starting with {expected}; got {s.quoted(key, url)}")
