"""The config as small immutable value classes. Parsing lives in `loader`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvmigrate.config.secret import Secret
from kvmigrate.policies.gates import GateConfig, RollbackConfig


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 4000
    master_key: Secret | None = None
    admin_key: Secret | None = None
    max_body_bytes: int = 32 * 1024 * 1024
    body_timeout_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class BackendConfig:
    name: str
    api_bases: tuple[str, ...]
    api_key: Secret | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 600.0
    max_connections: int = 1000
    # "openai": any OpenAI-compatible API; "azure": Azure OpenAI; "litellm": called through
    # litellm (kvmigrate.adapters.litellm_gateway), the model strings being litellm's.
    type: str = "openai"
    api_version: str | None = None  # azure: the api-version query parameter
    # litellm: extra keyword arguments for litellm (aws_region_name, vertex_project, ...);
    # values read from the environment are `Secret`s. Never printed.
    litellm_params: Mapping[str, object] = field(default_factory=dict, repr=False, hash=False)

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


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """One client-facing model name and what each backend calls it."""

    model_name: str
    served: dict[str, str]

    def served_name(self, backend: str) -> str | None:
        return self.served.get(backend)


@dataclass(frozen=True, slots=True)
class RolloutConfig:
    primary: str = "hosted"
    candidate: str = "vllm"
    mode: str = "shadow"
    percent: float = 0.0
    shadow_sample: float = 1.0
    steps: tuple[float, ...] = (10.0, 50.0, 100.0)
    state: str = "sqlite:///.kvmigrate/state.db"
    salt: str = "kvmigrate"
    fallback: bool = True
    shadow_max_concurrency: int = 64
    # Mirror requests the primary failed too (a retrying SDK sends each attempt again).
    shadow_primary_failures: bool = False
    noise_sample: float = 0.1
    noise_per_minute: float = 30.0
    pinning: bool = True
    pin_ttl_seconds: float = 3600.0
    bake_seconds: float = 600.0
    gates: GateConfig = field(default_factory=GateConfig)
    auto_rollback: RollbackConfig = field(default_factory=RollbackConfig)


@dataclass(frozen=True, slots=True)
class RecordConfig:
    enabled: bool = True
    db: str = "sqlite:///.kvmigrate/records.db"
    content: str = "redacted"
    retention_days: int = 30
    # Processes that parse, redact and write records (kvmigrate.recorder). Two by default:
    # the second raises the sustained rate (README, Performance), and at idle CPU priority
    # it only ever takes a core the proxy is not using.
    workers: int = 2


@dataclass(frozen=True, slots=True)
class CacheCheckConfig:
    """The online cache-buster detector (kvmigrate.cachecheck): what breaks prefix reuse."""

    enabled: bool = True
    max_conversations: int = 50_000
    ttl_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class Config:
    source: str
    server: ServerConfig
    backends: dict[str, BackendConfig]
    models: tuple[ModelRoute, ...]
    rollout: RolloutConfig
    record: RecordConfig = field(default_factory=RecordConfig)
    cachecheck: CacheCheckConfig = field(default_factory=CacheCheckConfig)

    def route(self, model_name: str) -> ModelRoute | None:
        for route in self.models:
            if route.model_name == model_name:
                return route
        return None

    @property
    def primary(self) -> BackendConfig:
        return self.backends[self.rollout.primary]

    @property
    def candidate(self) -> BackendConfig:
        return self.backends[self.rollout.candidate]
