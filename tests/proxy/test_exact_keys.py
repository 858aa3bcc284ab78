"""The proxy's keys match exactly, and in constant time.

The suite tried wrong keys that differ from the first character: a check by prefix, by
substring or without regard to case would have let every one of them through. Here each key
the proxy checks (the master key on the OpenAI and Messages routes and the model list, the
metrics key) is tried with its near misses, through a real proxy and the official SDKs, and
the comparison is watched to be `hmac.compare_digest` over the whole key.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from kvmigrate.config import parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.proxy import build_proxy_app
from kvmigrate.serving import BackgroundServer

MASTER = "sk-master-Key-0123456789"
METRICS = "metrics-Key-9876543210"
CLAUDE = "claude-sonnet-4-5"


def near_misses(key: str) -> dict[str, str]:
    """Keys a sloppy comparison would take for `key`: each differs only at its end, in
    case, or by being part of it or holding it."""
    return {
        "one shorter": key[:-1],
        "one longer": key + "0",
        "half": key[: len(key) // 2],
        "inner substring": key[1:-1],
        "holds it": "x" + key + "x",
        "last char's case": key[:-1] + key[-1].swapcase() if key[-1].isalpha() else key.swapcase(),
        "all upper": key.upper(),
        "all lower": key.lower(),
        "last char changed": key[:-1] + chr(ord(key[-1]) ^ 1),
    }


MASTER_MISSES = near_misses(MASTER)
METRICS_MISSES = near_misses(METRICS)


def test_the_near_misses_are_near_and_wrong() -> None:
    for key, misses in ((MASTER, MASTER_MISSES), (METRICS, METRICS_MISSES)):
        for name, miss in misses.items():
            assert miss != key, name
            assert miss, name
            near = miss in key or key in miss or miss.lower() == key.lower()
            assert near or miss[:-1] == key[:-1], name


@pytest.fixture(scope="module")
def proxy() -> Iterator[BackgroundServer]:
    # The emulator serves the Messages routes on any profile, as vLLM does.
    settings = EmulatorSettings("hosted", time_scale=0, models=("gpt-4o-mini", CLAUDE))
    with BackgroundServer(lambda: build_app(settings)) as hosted:
        config = parse_config(
            f"""
server: {{master_key: {MASTER}, metrics_key: {METRICS}}}
backends:
  hosted: {{api_base: "{hosted.url}/v1", api_key: sk-own}}
  vllm: {{api_base: "http://127.0.0.1:9/v1"}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini}}
  - {{model_name: {CLAUDE}, hosted: {CLAUDE}}}
rollout: {{mode: shadow, shadow_sample: 0}}
""",
            env={},
        )
        with BackgroundServer(lambda: build_proxy_app(config)) as server:
            yield server


def _chat(url: str, key: str) -> object:
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        return client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )


def _models(url: str, key: str) -> object:
    with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as client:
        return client.models.list()


def _message(url: str, key: str) -> object:
    with anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client:
        return client.messages.create(
            model=CLAUDE, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )


CALLS: dict[str, Callable[[str, str], object]] = {
    "chat": _chat,
    "models": _models,
    "messages": _message,
}
REFUSED: tuple[type[Exception], ...] = (openai.AuthenticationError, anthropic.AuthenticationError)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("miss", MASTER_MISSES)
def test_a_near_miss_of_the_master_key_is_refused(
    proxy: BackgroundServer, call: str, miss: str
) -> None:
    with pytest.raises(REFUSED) as refused:
        CALLS[call](proxy.url, MASTER_MISSES[miss])
    assert refused.value.status_code == 401  # type: ignore[attr-defined]


@pytest.mark.parametrize("call", CALLS)
def test_the_master_key_itself_is_let_in(proxy: BackgroundServer, call: str) -> None:
    assert CALLS[call](proxy.url, MASTER) is not None


def _scrape(url: str, key: str | None) -> int:
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    request = urllib.request.Request(url + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


@pytest.mark.parametrize("miss", [*METRICS_MISSES, "the master key"])
def test_a_near_miss_of_the_metrics_key_is_refused(proxy: BackgroundServer, miss: str) -> None:
    key = MASTER if miss == "the master key" else METRICS_MISSES[miss]
    assert _scrape(proxy.url, key) == 401
    assert _scrape(proxy.url, METRICS) == 200


@pytest.fixture
def comparisons(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any]]:
    """Every `hmac.compare_digest` call, noted and then made (the real one decides)."""
    calls: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def noted(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", noted)
    return calls


@pytest.mark.parametrize("call", CALLS)
def test_the_master_key_is_compared_in_constant_time(
    proxy: BackgroundServer, comparisons: list[tuple[Any, Any]], call: str
) -> None:
    wrong = MASTER_MISSES["one shorter"]
    with pytest.raises(REFUSED):
        CALLS[call](proxy.url, wrong)
    assert (MASTER.encode(), wrong.encode()) in comparisons
    comparisons.clear()
    CALLS[call](proxy.url, MASTER)
    assert (MASTER.encode(), MASTER.encode()) in comparisons


def test_the_metrics_key_is_compared_in_constant_time(
    proxy: BackgroundServer, comparisons: list[tuple[Any, Any]]
) -> None:
    assert _scrape(proxy.url, METRICS + "0") == 401
    assert (METRICS.encode(), (METRICS + "0").encode()) in comparisons
