"""Backend kinds: each builds its URLs, carries its key and names its probe, in one place."""

from __future__ import annotations

import pytest

from kvmigrate.config import BackendConfig, Secret
from kvmigrate.proxy.kinds import AzureKind, BackendKind, LiteLLMKind, kind_of
from kvmigrate.proxy.upstream import Upstream

BASE = "http://10.0.0.1:8000/v1"
KEY = Secret("sk-backend-own-key")


def backend(kind: str, **extra: object) -> BackendConfig:
    return BackendConfig(name="b", api_bases=(BASE,), api_key=KEY, type=kind, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "kind", "url", "auth", "probe"),
    [
        (
            backend("openai"),
            BackendKind,
            f"{BASE}/chat/completions",
            {"Authorization": "Bearer sk-backend-own-key"},
            f"{BASE}/models",
        ),
        (
            backend("azure", api_version="2024-10-21"),
            AzureKind,
            f"{BASE}/openai/deployments/gpt%2F4o/chat/completions?api-version=2024-10-21",
            {"api-key": "sk-backend-own-key"},
            f"{BASE}/openai/models?api-version=2024-10-21",
        ),
        (
            backend("litellm"),
            LiteLLMKind,
            f"{BASE}/chat/completions",
            {"Authorization": "Bearer sk-backend-own-key"},
            f"{BASE}/models",
        ),
    ],
)
def test_each_kind_builds_its_url_auth_and_probe(
    config: BackendConfig, kind: type[BackendKind], url: str, auth: dict[str, str], probe: str
) -> None:
    chosen = kind_of(config)
    assert type(chosen) is kind
    assert chosen.url(BASE, "chat/completions", deployment="gpt/4o") == url
    assert chosen.auth_headers(KEY) == auth
    assert chosen.probe_url(BASE) == probe
    upstream = Upstream(config)
    assert upstream.url("chat/completions", "conv", deployment="gpt/4o") == url
    assert upstream.probe() == (probe, auth)
    # A replica taken out of rotation is probed the way its kind expects.
    assert upstream.replicas._probe_url(BASE) == probe
    assert upstream.replicas._probe_headers == auth


def test_only_litellm_is_reached_through_a_gateway() -> None:
    assert [
        k
        for k in ("openai", "azure", "litellm")
        if kind_of(backend(k, api_version="v")).via_gateway
    ] == ["litellm"]


def test_a_backend_without_a_key_adds_none() -> None:
    upstream = Upstream(BackendConfig(name="b", api_bases=(BASE,), type="azure", api_version="v"))
    assert upstream.auth is None
    assert upstream.probe()[1] == {}
    # A pass-through path (no deployment) on Azure stays below the base.
    assert upstream.url("files") == f"{BASE}/files"
