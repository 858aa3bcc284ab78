"""Cohorts in running proxies: each cohort's traffic follows its own rollout, proxies sharing
Redis follow a cohort's change within a second, and a failing candidate in one cohort rolls
back that cohort alone. Real proxies and emulators on loopback, the openai SDK as client."""

from __future__ import annotations

import logging
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.recorder.evidence import open_controller
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BILLING = {"X-Agent": "billing-bot"}


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, BackgroundServer]]:
    servers = {
        name: BackgroundServer(lambda name=name: build_app(EmulatorSettings(name, time_scale=0)))
        for name in ("hosted", "vllm")
    }
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


def make_config(tmp_path: Path, emulators: dict[str, BackgroundServer], state: str) -> Config:
    return parse_config(
        f"""
backends:
  hosted: {{api_base: "{emulators["hosted"].url}/v1"}}
  vllm: {{api_base: "{emulators["vllm"].url}/v1", candidate_headers: [x-emulator-fault]}}
models:
  - {{model_name: gpt-4o-mini, hosted: gpt-4o-mini, vllm: {VLLM_MODEL}}}
  - {{model_name: gpt-4o, hosted: gpt-4o-mini, vllm: {VLLM_MODEL}}}
cohorts:
  - {{name: billing-bot, model: gpt-4o-mini, match: {{header: {{X-Agent: billing-bot}}}}}}
rollout:
  state: "{state}"
  auto_rollback: {{window_seconds: 30, min_requests: 10}}
record: {{enabled: false, db: "sqlite:///{tmp_path}/records.db"}}
""",
        env={},
    )


@pytest.fixture
def proxies() -> Iterator[Callable[[Config], BackgroundServer]]:
    started: list[BackgroundServer] = []

    def start(config: Config) -> BackgroundServer:
        server = BackgroundServer(lambda: build_runtime_app(config, poll_interval=0.1)).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def served_by(
    proxy: BackgroundServer, model: str, text: str, headers: dict[str, str] | None = None
) -> str:
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-c", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": text}], extra_headers=headers
        )
    return raw.headers["x-kvmigrate-backend"]


def _metrics(proxy: BackgroundServer) -> str:
    with urllib.request.urlopen(proxy.url + "/metrics") as answer:
        return str(answer.read().decode())


def wait_until(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.02)
    return time.monotonic() - start


def test_two_proxies_sharing_redis_follow_one_cohorts_change_within_a_second(
    tmp_path: Path,
    emulators: dict[str, BackgroundServer],
    proxies: Callable[[Config], BackgroundServer],
    fresh_redis_url: str,
) -> None:
    config = make_config(tmp_path, emulators, fresh_redis_url)
    a, b = proxies(config), proxies(config)
    controller = open_controller(config)
    try:
        controller.set_percent(100, "mini first", "test", force=True, cohort="gpt-4o-mini")
        took = wait_until(
            lambda: all(served_by(p, "gpt-4o-mini", "x") == "vllm" for p in (a, b)), 1.0
        )
        assert took < 1.0
        for proxy in (a, b):  # the other cohorts did not move
            assert served_by(proxy, "gpt-4o", "x") == "hosted"
            assert served_by(proxy, "gpt-4o-mini", "x", BILLING) == "hosted"
        controller.set_percent(100, "billing next", "test", force=True, cohort="billing-bot")
        wait_until(
            lambda: all(served_by(p, "gpt-4o-mini", "y", BILLING) == "vllm" for p in (a, b)), 1.0
        )
        assert served_by(a, "gpt-4o", "y") == "hosted"
    finally:
        controller.store.close()


def test_a_failing_candidate_rolls_back_only_its_cohort(
    tmp_path: Path,
    emulators: dict[str, BackgroundServer],
    proxies: Callable[[Config], BackgroundServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kvmigrate.rollout")
    config = make_config(tmp_path, emulators, f"sqlite:///{tmp_path}/state.db")
    proxy = proxies(config)
    controller = open_controller(config)
    try:
        for cohort in config.cohort_names():
            controller.set_percent(100, "all in", "test", force=True, cohort=cohort)
        # Generous: the proxy follows the store within a second on a quiet machine, and the
        # test that holds it to that is the Redis one above.
        wait_until(lambda: served_by(proxy, "gpt-4o-mini", "w", BILLING) == "vllm", 30.0)
        # The candidate fails every billing-bot request (the fault header reaches only the
        # candidate's emulator); each falls back to the primary, so clients see no error.
        fault = {**BILLING, "x-emulator-fault": "vllm:500"}
        for i in range(30):
            assert served_by(proxy, "gpt-4o-mini", f"b{i}", fault) == "hosted"
        wait_until(lambda: controller.read("billing-bot").percent == 0, 10.0)
        last = controller.history(1, cohort="billing-bot")[-1]
        assert (last.action, last.cohort) == ("auto-rollback", "billing-bot")
        assert "error rate" in last.reason
        assert controller.read("gpt-4o-mini").percent == 100
        assert controller.read("gpt-4o").percent == 100
        assert served_by(proxy, "gpt-4o-mini", "after") == "vllm"
        assert served_by(proxy, "gpt-4o", "after") == "vllm"
        # The gauge shows the proxy's own snapshot, which its next read of the store brings.
        rolled_back = 'kvmigrate_rollout_percent{cohort="billing-bot"} 0.0'
        wait_until(lambda: rolled_back in _metrics(proxy), 30.0)
        metrics = _metrics(proxy)
        assert 'kvmigrate_auto_rollbacks_total{cohort="billing-bot"} 1.0' in metrics
        assert 'kvmigrate_rollout_percent{cohort="gpt-4o"} 100.0' in metrics
        logged = [r.getMessage() for r in caplog.records if "auto-rollback" in r.getMessage()]
        assert logged
        assert all("auto-rollback of billing-bot" in line for line in logged)
    finally:
        controller.store.close()
