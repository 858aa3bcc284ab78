"""The config schema, declared once: each section's keys, types, defaults and bounds.

`loader` reads a file against these declarations (`schema.read_struct`), so a default or a
bound is written here and nowhere else. A field's name in the file is its msgspec name
(`api_bases` is `api_base`).
"""

# No `from __future__ import annotations`: the schema reads a Literal's values, in their
# declared order, from the class's annotations as they are.
from collections.abc import Mapping
from typing import Annotated, ClassVar, Final, Literal

import msgspec
from msgspec import Meta

from kvmigrate.config.secret import Secret
from kvmigrate.policies.gates import GateConfig, RollbackConfig
from kvmigrate.policies.modes import Mode

# "openai": any OpenAI-compatible API; "azure": Azure OpenAI; "litellm": called through
# litellm (kvmigrate.litellm_bridge.gateway), the model strings being litellm's;
# "anthropic": Anthropic's Messages API (only /v1/messages, key in `x-api-key`).
BackendType = Literal["openai", "azure", "litellm", "anthropic"]
# Types whose API has no Messages routes: a model served on an `anthropic` backend cannot
# also be routed to one of them (kvmigrate never translates Messages to chat completions).
NO_MESSAGES_TYPES = frozenset({"azure", "litellm"})
ContentPolicy = Literal["none", "redacted", "full"]
Durability = Literal["spool", "fsync", "memory"]

# policies.gates owns the gates' fields and defaults (it is pure and knows no config file);
# the values a config file may give them are bounded here.
LIMITS: Final[Mapping[type, Mapping[str, Meta]]] = {
    GateConfig: {
        "min_conversations": Meta(ge=0),
        "min_requests": Meta(ge=0),
        "error_rate_margin": Meta(ge=0.0, le=1.0),
        "ttft_p95_slo_ms": Meta(ge=0.0),
        "ttft_p95_factor": Meta(ge=0.0),
        "ttft_p95_floor_ms": Meta(ge=0.0),
        "min_parity": Meta(ge=0.0, le=1.0),
        "min_parity_samples": Meta(ge=1),
        "tps_p50_min": Meta(ge=0.0),
        "window_seconds": Meta(ge=1.0),
        "confidence": Meta(ge=0.5, le=0.9999),
    },
    RollbackConfig: {
        "window_seconds": Meta(ge=1.0),
        "min_requests": Meta(ge=1),
        "max_error_rate": Meta(ge=0.0, le=1.0),
        "error_rate_margin": Meta(ge=0.0, le=1.0),
        "ttft_p95_factor": Meta(ge=1.0),
        "ttft_p95_ms": Meta(ge=0.0),
        "ttft_floor_ms": Meta(ge=0.0),
        "max_invalid_tool_call_rate": Meta(ge=0.0, le=1.0),
        "min_tool_calls": Meta(ge=1),
    },
}


# Lengths no value of these kinds has business exceeding: a host name (RFC 1035), a URL, a
# model's name (a path or a cloud ARN at most), the name of a backend or a cohort. A string
# declared with a `max_length` is one word besides: the loader refuses any whitespace or
# control character in it (`Section.word`), as a line break in a URL read from the
# environment would end up in every request line and log line.
HOST_MAX_CHARS: Final = 253
URL_MAX_CHARS: Final = 4096
MODEL_NAME_MAX_CHARS: Final = 512
NAME_MAX_CHARS: Final = 128
HostName = Annotated[str, Meta(max_length=HOST_MAX_CHARS)]
Url = Annotated[str, Meta(max_length=URL_MAX_CHARS)]


class ConfigSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A mapping of the config file. `not_keys`: fields that no key of the file sets;
    `other_keys`: the field that collects the keys named by the user (backend names)."""

    not_keys: ClassVar[tuple[str, ...]] = ()
    other_keys: ClassVar[str | None] = None


class ServerConfig(ConfigSection, frozen=True):
    host: HostName = "127.0.0.1"  # the address the proxy listens on
    port: Annotated[int, Meta(ge=0, le=65535)] = 4000
    # When set, clients must send it as their Bearer key (compared in constant time). Unset,
    # with no api_key on the primary, each client's key passes through to the primary, and
    # the candidate sees a request only once the primary accepted its key.
    master_key: Secret | None = None
    # Guards /admin and remote rollout changes (`--proxy-url`).
    admin_key: Secret | None = None
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 32 * 1024 * 1024  # larger bodies get a 413
    # A body that trickles in slower than this gets a 408.
    body_timeout_seconds: Annotated[float, Meta(ge=0.1)] = 30.0
    # Guards /metrics when set (a Bearer key for the scraper); unset, /metrics is open.
    metrics_key: Secret | None = None
    # A client must send its whole request head within this.
    header_timeout_seconds: Annotated[float, Meta(ge=0.1)] = 10.0
    # A kept-alive connection with no request in flight is closed after this.
    idle_timeout_seconds: Annotated[float, Meta(ge=0.1)] = 30.0
    # Open client connections at most; 0: a third of the process's file-descriptor limit
    # (each request can hold a client, an upstream and a shadow connection).
    max_connections: Annotated[int, Meta(ge=0)] = 0
    # The `model` an answer names: `served`, the backend's own (as relayed); `requested`, the
    # name the client sent, spliced into every chunk (costs a scan of each chunk).
    answer_model: Literal["served", "requested"] = "served"
    # Without a master key, how long the primary's acceptance of a client's key lets that
    # key reach the candidate before the primary is asked again (a revoked key's grace).
    client_key_ttl_seconds: Annotated[float, Meta(ge=1.0, le=86400.0)] = 300.0


class BackendConfig(ConfigSection, frozen=True):
    not_keys: ClassVar[tuple[str, ...]] = ("name",)

    name: str  # its key under `backends:`
    # The replica URLs, from `api_base` (one URL or a list); a litellm backend may have none.
    api_bases: tuple[str, ...] = msgspec.field(name="api_base")
    # This backend's own key. Unset on the primary: the client's key passes through to it
    # (never to a candidate).
    api_key: Secret | None = None
    connect_timeout: Annotated[float, Meta(ge=0.001)] = 5.0  # seconds to open a connection
    # Seconds of silence allowed while waiting for the answer's bytes.
    read_timeout: Annotated[float, Meta(ge=0.001)] = 600.0
    max_connections: Annotated[int, Meta(ge=1)] = 1000  # the backend's connection pool size
    # The API this backend speaks: `openai` (any OpenAI-compatible API, vLLM included),
    # `azure` (Azure OpenAI: models map to deployments), `litellm` (Bedrock, Vertex, ...
    # through litellm: `pip install 'kvmigrate[litellm]'`), `anthropic` (the Messages API).
    type: BackendType = "openai"
    # azure: the api-version query parameter (`2024-10-21`, `2024-05-01-preview`).
    api_version: Annotated[str, Meta(max_length=64)] | None = None
    # litellm: extra keyword arguments for litellm (aws_region_name, vertex_project, ...);
    # values read from the environment are `Secret`s. Never printed.
    litellm_params: Mapping[str, object] = msgspec.field(default_factory=dict)
    # Client headers this backend gets as a candidate, besides the built-in allowlist
    # (kvmigrate.proxy.headers). A name that may carry a credential is refused at load and
    # dropped at run time (kvmigrate.credential_names).
    candidate_headers: tuple[str, ...] = ()

    def _shown(self) -> tuple[tuple[str, object], ...]:
        """Every field but litellm_params, which may hold anything and is never printed."""
        return tuple((k, getattr(self, k)) for k in self.__struct_fields__ if k != "litellm_params")

    def __repr__(self) -> str:
        return f"BackendConfig({', '.join(f'{k}={v!r}' for k, v in self._shown())})"

    def __hash__(self) -> int:  # hashable as before: litellm_params holds a dict
        return hash(self._shown())

    @property
    def api_base(self) -> str:
        """The first replica; a litellm backend without `api_base` has none (see api_bases)."""
        return self.api_bases[0]

    def direct_api_bases(self, command: str) -> tuple[str, ...]:
        """The replicas a `command` that calls this backend over HTTP itself (bench, doctor,
        parity replay) may call. A litellm backend has none: its model strings are
        litellm's, and only `kvmigrate proxy` serves it."""
        if self.type == "litellm":
            raise NotDirect(
                f"backend '{self.name}' is type litellm: `kvmigrate {command}` calls backends "
                "over HTTP directly, and only `kvmigrate proxy` serves a litellm backend (its "
                "traffic is measured in the proxy's records: `kvmigrate report`)"
            )
        return self.api_bases


class NotDirect(Exception):
    """A backend that only the proxy can reach, asked for by a command that calls it."""


class ModelRoute(ConfigSection, frozen=True):
    """One client-facing model name and what each backend calls it (`hosted: gpt-4o-mini`:
    the backends' names are this mapping's other keys)."""

    other_keys: ClassVar[str | None] = "served"

    model_name: str  # what clients send
    # `BACKEND: MODEL`: what each backend (a name under `backends:`) calls this model.
    served: dict[str, str]
    # Several candidate backends: each gets its own shadow copy, and a split gives its
    # share to one at a time. Empty: rollout.candidate alone.
    candidates: tuple[str, ...] = ()

    def served_name(self, backend: str) -> str | None:
        return self.served.get(backend)


class RolloutConfig(ConfigSection, frozen=True):
    primary: str = "hosted"  # the incumbent: a backend's name
    # The backend being rolled out: a backend's name. Left out, with no backend of this
    # name, the primary is observed alone (mode observe).
    candidate: str = "vllm"
    # shadow: the primary answers and the candidate gets a copy; split: the candidate
    # answers `percent`% of conversations; observe: the primary answers and nobody gets a
    # copy, to measure the hosted API before any candidate exists (`kvmigrate rollout`
    # refuses to change it).
    mode: Mode = Mode.SHADOW
    percent: Annotated[float, Meta(ge=0.0, le=100.0)] = 0.0  # split: the candidate's share
    # The share of conversations (not requests) shadowed to the candidate.
    shadow_sample: Annotated[float, Meta(ge=0.0, le=1.0)] = 1.0
    # Increasing percentages in (0, 100].
    steps: tuple[float, ...] = (10.0, 50.0, 100.0)
    # Where the live rollout state, its history and the pins live: a SQLite file for one
    # proxy, `redis://...` for several.
    state: Url = "sqlite:///.kvmigrate/state.db"
    salt: str = "kvmigrate"  # changes which conversations fall in the candidate's buckets
    # Split mode: a candidate failure or refusal (4xx) before the first byte goes to the
    # primary instead.
    fallback: bool = True
    # Shadow copies in flight beyond this are dropped and counted, never queued.
    shadow_max_concurrency: Annotated[int, Meta(ge=0)] = 64
    # The request bodies the copies in flight may hold, per candidate.
    shadow_max_bytes: Annotated[int, Meta(ge=0)] = 256 * 1024 * 1024
    # Shadow requests the primary failed too (a retrying SDK sends each attempt again).
    shadow_primary_failures: bool = False
    # Of shadowed conversations, the share also sent to the primary twice, so parity can
    # subtract the primary's own disagreement. 0.5, not less: a pilot of the gates' minimum
    # size must bring the 20 noise pairs a parity verdict needs
    # (tests/rollout/test_gate_evidence.py).
    noise_sample: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.5
    # The budget of those second calls to the primary, per minute.
    noise_per_minute: Annotated[float, Meta(ge=0.0)] = 30.0
    pinning: bool = True  # a conversation stays on the backend of its first turn ...
    # ... for this long, so a percent change moves only new conversations.
    pin_ttl_seconds: Annotated[float, Meta(ge=1.0)] = 3600.0
    bake_seconds: Annotated[float, Meta(ge=0.0)] = 600.0  # `rollout auto` waits this at a step
    gates: GateConfig = msgspec.field(default_factory=GateConfig)
    auto_rollback: RollbackConfig = msgspec.field(default_factory=RollbackConfig)


class RecordConfig(ConfigSection, frozen=True):
    enabled: bool = True  # false: no records (reports, gates and parity have no evidence)
    # A SQLite file for one proxy, `postgresql://...` for several.
    db: Url = "sqlite:///.kvmigrate/records.db"
    # What of prompts and answers is stored: nothing, redacted (docs/security.md), or all.
    content: ContentPolicy = "redacted"
    retention_days: Annotated[int, Meta(ge=1)] = 30  # older records are deleted
    # Keys the hash of conversation ids taken from `user` or `X-Session-ID` (personal data)
    # in records, unless `content: full`. Unset: a key derived from the rollout store's
    # secret (the same for every proxy on the store, and after a restart).
    hash_key: Secret | None = None
    # Processes that parse, redact and write records (kvmigrate.recorder). Two by default:
    # the second raises the sustained rate (docs/performance.md), and at idle CPU priority
    # it only ever takes a core the proxy is not using.
    workers: Annotated[int, Meta(ge=1, le=64)] = 2
    # What a crash may lose (kvmigrate.recorder.addon): `spool` none of the answers a crashed
    # process had spooled, `fsync` that through a machine's crash too, `memory` what the
    # workers held.
    durability: Durability = "spool"
    # Where answers wait, unredacted (0700, files 0600), until written. "": beside the
    # records database (records.db.spool/).
    spool_dir: str = ""
    # Per proxy process: past it, new records are dropped and counted.
    spool_max_mb: Annotated[int, Meta(ge=1)] = 256


class CacheCheckConfig(ConfigSection, frozen=True):
    """The online cache-buster detector (kvmigrate.cachecheck): what breaks prefix reuse."""

    enabled: bool = True  # counted in kvmigrate_cache_breaks_total and its siblings
    max_conversations: Annotated[int, Meta(ge=1)] = 50_000  # conversations it follows at once
    ttl_seconds: Annotated[float, Meta(ge=1.0)] = 3600.0  # a conversation idle this long is let go


class GpuConfig(ConfigSection, frozen=True):
    """GPU and KV use of the candidates (kvmigrate.engine): each replica's vLLM /metrics and
    a GPU-utilisation source, scraped in the background and stored with the records, so
    `kvmigrate report` shows them over its window beside the proxy's own figures."""

    # Scrape the vLLM /metrics of every replica of each candidate of type openai (beside its
    # api_base: `http://h:8000/v1` is scraped at `http://h:8000/metrics`).
    scrape: bool = False
    interval_seconds: Annotated[float, Meta(ge=1.0, le=3600.0)] = 15.0  # between two scrapes
    timeout_seconds: Annotated[float, Meta(ge=0.1, le=60.0)] = 5.0  # a scrape slower fails
    # An answer larger than this is cut off there and counted as a failed scrape.
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 8 * 1024 * 1024
    # `cpu`: the candidates run a CPU build of vLLM, which has no GPU utilisation to find.
    device: Literal["gpu", "cpu"] = "gpu"
    # `BACKEND: [URL, ...]`: each replica's /metrics, where it is not beside its api_base
    # (replicas behind one load balancer). Every candidate not named keeps the default.
    metrics_urls: Mapping[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    # DCGM exporters' /metrics: GPU utilisation is the mean DCGM_FI_DEV_GPU_UTIL of the GPUs
    # they list (only the candidates' GPUs, or the figure is diluted).
    dcgm_urls: tuple[str, ...] = ()
    # Or a Prometheus server (`http://prometheus:9090`), asked for `prometheus_query`.
    prometheus_url: Url | None = None
    # An instant query whose first value is the candidates' GPU utilisation in percent.
    prometheus_query: str = "avg(DCGM_FI_DEV_GPU_UTIL)"
    # For cost per token: the GPUs serving the candidate. 0: as many as the DCGM exporters
    # list, else `gpus_per_replica` times the replicas that answered a scrape (or the
    # candidate's api_base entries, without a scrape).
    gpus: Annotated[int, Meta(ge=0, le=100_000)] = 0
    gpus_per_replica: Annotated[int, Meta(ge=1, le=64)] = 1  # what one replica runs on


class CohortMatch(ConfigSection, frozen=True):
    """What narrows a cohort within its model group: every part given must match. Header
    names match case-insensitively; `client_key` is the key a client sends as its Bearer
    token (never stored or shown: the cohort's name is its label)."""

    header: Mapping[str, str] = msgspec.field(default_factory=dict)  # header values
    metadata: Mapping[str, str] = msgspec.field(default_factory=dict)  # `metadata` values
    client_key: Secret | None = None  # the client's Bearer key; never stored or shown


class CohortConfig(ConfigSection, frozen=True):
    """A cohort: part of a model group's traffic that moves on its own rollout. The traffic
    of a model that no named cohort matches is the model's own cohort, named after it."""

    name: str  # unique, and not a model_name: `rollout --cohort NAME`
    model: str  # a models[].model_name
    match: CohortMatch = msgspec.field(default_factory=CohortMatch)
    # Unset: the rollout's.
    steps: tuple[float, ...] | None = None
    bake_seconds: Annotated[float, Meta(ge=0.0)] | None = None  # unset: the rollout's


class Config(ConfigSection, frozen=True):
    not_keys: ClassVar[tuple[str, ...]] = ("source",)

    source: str  # the file it was read from
    server: ServerConfig
    backends: dict[str, BackendConfig]
    models: tuple[ModelRoute, ...]
    rollout: RolloutConfig
    record: RecordConfig = msgspec.field(default_factory=RecordConfig)
    cachecheck: CacheCheckConfig = msgspec.field(default_factory=CacheCheckConfig)
    cohorts: tuple[CohortConfig, ...] = ()
    gpu: GpuConfig = msgspec.field(default_factory=GpuConfig)

    def cohort_names(self) -> tuple[str, ...]:
        """Every cohort, each model's named ones before the model's own (its remainder). A
        model that no candidate serves (embeddings on the primary only) has no rollout, so
        no cohort."""
        names: list[str] = []
        for model in self.models:
            if not set(self.candidates_of(model.model_name)) & set(model.served):
                continue
            names += [c.name for c in self.cohorts if c.model == model.model_name]
            names.append(model.model_name)
        return tuple(names)

    def cohort(self, name: str) -> CohortConfig | None:
        return next((c for c in self.cohorts if c.name == name), None)

    def candidates_of(self, cohort: str) -> tuple[str, ...]:
        """The cohort's candidate backends, the default one (what a split promotes unless
        `rollout --candidate` chose another) first."""
        named = self.cohort(cohort)
        route = self.route(named.model if named else cohort)
        return route.candidates if route and route.candidates else (self.rollout.candidate,)

    def own_model(self, cohort: str) -> str:
        """The model whose own cohort `cohort` is, or "" for a named cohort (or none)."""
        return cohort if self.route(cohort) is not None else ""

    def steps_of(self, cohort: str) -> tuple[float, ...]:
        named = self.cohort(cohort)
        return named.steps if named and named.steps else self.rollout.steps

    def route(self, model_name: str) -> ModelRoute | None:
        for route in self.models:
            if route.model_name == model_name:
                return route
        return None

    def candidate_backends(self) -> tuple[str, ...]:
        """Every backend some cohort may shadow or split to, the rollout's own first."""
        names = [self.rollout.candidate]
        for model in self.models:
            names += [n for n in model.candidates if n not in names]
        return tuple(names)

    @property
    def primary(self) -> BackendConfig:
        return self.backends[self.rollout.primary]

    @property
    def candidate(self) -> BackendConfig:
        return self.backends[self.rollout.candidate]
