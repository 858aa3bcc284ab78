"""Health, readiness and metrics endpoints, as a load balancer and Prometheus see them."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from proxy_support import ProxyFactory

from kvmigrate.serving import free_port


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_health_and_ready(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy()
    assert get(proxy.url + "/health")[0] == 200
    status, _, body = get(proxy.url + "/ready")
    assert status == 200
    assert json.loads(body)["backends"] == {"hosted": "ok", "vllm": "ok"}


def test_not_ready_while_the_primary_is_down(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(hosted_url=f"http://127.0.0.1:{free_port()}")
    status, _, body = get(proxy.url + "/ready")
    assert status == 503
    report = json.loads(body)
    assert report["backends"]["vllm"] == "ok"
    assert report["backends"]["hosted"].startswith("unreachable")


def test_ready_while_only_the_candidate_is_down(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy(vllm_url=f"http://127.0.0.1:{free_port()}")
    assert get(proxy.url + "/ready")[0] == 200


def test_metrics_are_prometheus_text(make_proxy: ProxyFactory) -> None:
    proxy = make_proxy()
    proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    # TTFT is observed on streamed answers only.
    stream = proxy.client().chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    assert list(stream)
    status, content_type, body = get(proxy.url + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    for name in (
        "kvmigrate_requests_total",
        "kvmigrate_ttft_seconds_bucket",
        "kvmigrate_request_duration_seconds_bucket",
        "kvmigrate_tokens_total",
        "kvmigrate_shadow_dropped_total",
        "kvmigrate_overhead_seconds_bucket",
    ):
        assert name in body, name
    assert 'kvmigrate_tokens_total{backend="hosted",kind="prompt",role="serve"}' in body
    assert 'kvmigrate_shadow_dropped_total{reason="concurrency_limit"} 0.0' in body


def test_unknown_route_gets_an_envelope(make_proxy: ProxyFactory) -> None:
    status, content_type, body = get(make_proxy().url + "/nope")
    assert status == 404
    assert content_type.startswith("application/json")
    assert "error" in json.loads(body)
