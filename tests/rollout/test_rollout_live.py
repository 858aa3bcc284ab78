"""Running proxies and the rollout commands: live pickup, shared Redis, pins, admin API,
auto-rollback. Real proxies on loopback, the real CLI in subprocesses."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis

from kvmigrate.config import Config, parse_config
from kvmigrate.emulator import EmulatorSettings, build_app
from kvmigrate.emulator.settings import FaultRates
from kvmigrate.runtime import build_app as build_runtime_app
from kvmigrate.serving import BackgroundServer

MODEL = "gpt-4o-mini"


@dataclass
class Setup:
    config_path: Path
    config: Config


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, BackgroundServer]]:
    servers = {
        "hosted": BackgroundServer(lambda: build_app(EmulatorSettings("hosted", time_scale=0))),
        "vllm": BackgroundServer(lambda: build_app(EmulatorSettings("vllm", time_scale=0))),
        "broken": BackgroundServer(
            lambda: build_app(
                EmulatorSettings(
                    "vllm", name="broken", time_scale=0, faults=FaultRates(error_rate=1.0)
                )
            )
        ),
    }
    for server in servers.values():
        server.start()
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def setup(tmp_path: Path, emulators: dict[str, BackgroundServer]) -> Callable[..., Setup]:
    def make(state: str | None = None, candidate: str = "vllm", extra: str = "") -> Setup:
        text = f"""
server: {{admin_key: adm-secret}}
backends:
  hosted: {{api_base: "{emulators["hosted"].url}/v1"}}
  vllm: {{api_base: "{emulators[candidate].url}/v1"}}
models:
  - {{model_name: {MODEL}, hosted: {MODEL}, vllm: meta-llama/Llama-3.1-8B-Instruct}}
rollout:
  state: "{state or f"sqlite:///{tmp_path}/state.db"}"
  # A test bed's few hundred requests can show a 10-point error margin, not a 1-point one.
  # Both emulators answer at once (time_scale 0): every latency is the machine's noise,
  # a few ms quiet and up to 92 ms p95 beside a CPU hog, which the default 100 ms floor
  # left the latency gate inconclusive on for good. The floor is 10x that: these tests walk
  # the steps, and the broken candidate fails on its errors; the latency gate's ratio is
  # tested at its boundaries in tests/policies/test_gate_boundaries.py.
  gates: {{min_conversations: 2, min_requests: 4, error_rate_margin: 0.1,
           ttft_p95_floor_ms: 1000}}
  auto_rollback: {{window_seconds: 20, min_requests: 10}}
{extra}
record: {{db: "sqlite:///{tmp_path}/records.db"}}
"""
        path = tmp_path / "config.yaml"
        path.write_text(text)
        return Setup(path, parse_config(text, env={}))

    return make


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


def cli(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = None if key is None else {"KVMIGRATE_ADMIN_KEY": key, "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "kvmigrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def served_by(proxy: BackgroundServer, conversation: str, turn_messages: int = 0) -> str:
    messages: list[dict[str, str]] = [{"role": "user", "content": conversation}]
    for i in range(turn_messages):
        messages += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": "go"}]
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-c", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    return raw.headers["x-kvmigrate-backend"]


# The proxies poll the store every 0.1 s (the `proxies` fixture), so a change is applied
# within about 0.1 s on a quiet machine: a 1 s bound (the promise in DESIGN.md) is a 10x margin.
PICKUP_BOUND_S = 1.0
# Waits that are not the behaviour under test (CLI subprocesses, auto-rollback): generous.
DEADLINE_S = 30.0


def applied_version(proxy: BackgroundServer) -> float:
    """The rollout state version the proxy reports it applies (its own metric, one series
    per cohort: the lowest, so every cohort has it)."""
    with urllib.request.urlopen(proxy.url + "/metrics", timeout=10) as response:
        versions = [
            float(line.split()[-1])
            for line in response.read().decode().splitlines()
            if line.startswith(("kvmigrate_rollout_version ", "kvmigrate_rollout_version{"))
        ]
    if not versions:
        raise AssertionError("no kvmigrate_rollout_version metric")
    return min(versions)


def wait_until(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.02)
    return time.monotonic() - start


def test_cli_change_reaches_a_running_proxy_within_a_second(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
) -> None:
    s = setup()
    proxy = proxies(s.config)
    assert served_by(proxy, "hello") == "hosted"
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk", max_retries=0)
    in_flight: list[str] = []
    stream = client.chat.completions.create(
        model=MODEL, stream=True, messages=[{"role": "user", "content": "long"}], max_tokens=50
    )
    reader = threading.Thread(
        target=lambda: in_flight.extend(
            c.choices[0].delta.content or "" for c in stream if c.choices
        )
    )
    reader.start()
    done = cli(
        "rollout", "--percent", "100", "--force", "--reason", "go", "--config", str(s.config_path)
    )
    assert done.returncode == 0, done.stderr
    assert "shadow 0% -> split 100%" in done.stdout
    assert wait_until(lambda: applied_version(proxy) >= 1, PICKUP_BOUND_S) < PICKUP_BOUND_S
    assert served_by(proxy, "hello") == "vllm"
    reader.join(10)
    client.close()
    assert "".join(in_flight)  # the request in flight during the change finished cleanly


def test_two_proxies_sharing_redis_both_switch(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
    fresh_redis_url: str,
) -> None:
    s = setup(state=fresh_redis_url)
    a, b = proxies(s.config), proxies(s.config)
    assert served_by(a, "x") == served_by(b, "x") == "hosted"
    done = cli("rollout", "--percent", "100", "--force", "--config", str(s.config_path))
    assert done.returncode == 0, done.stderr
    wait_until(lambda: applied_version(a) >= 1 and applied_version(b) >= 1, PICKUP_BOUND_S)
    assert served_by(a, "y") == served_by(b, "y") == "vllm"
    status = json.loads(cli("rollout", "status", "--json", "--config", str(s.config_path)).stdout)
    assert status["state"]["percent"] == 100


def conversations_on(proxy: BackgroundServer, names: list[str], turn: int = 0) -> dict[str, str]:
    return {n: served_by(proxy, n, turn) for n in names}


@pytest.mark.slow
@pytest.mark.parametrize("pinning", [True, False])
def test_pins_keep_conversations_where_they_started(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
    fresh_redis_url: str,
    pinning: bool,
) -> None:
    s = setup(state=fresh_redis_url, extra=f"  pinning: {str(pinning).lower()}")
    first, second = proxies(s.config), proxies(s.config)
    assert (
        cli("rollout", "--percent", "10", "--force", "--config", str(s.config_path)).returncode == 0
    )
    wait_until(lambda: applied_version(first) == applied_version(second) == 1, DEADLINE_S)
    names = [f"conversation {i}" for i in range(40)]
    at_10 = conversations_on(first, names)
    # Every conversation seen in split mode is pinned; the pins reach Redis in the background.
    pins = redis.Redis.from_url(fresh_redis_url)
    wait_until(lambda: len(list(pins.scan_iter("*pin:*"))) >= (40 if pinning else 0), DEADLINE_S)
    pins.close()
    assert (
        cli("rollout", "--percent", "50", "--force", "--config", str(s.config_path)).returncode == 0
    )
    wait_until(lambda: applied_version(first) == applied_version(second) == 2, DEADLINE_S)
    # Turn 2 of each conversation lands on the other replica, as behind a load balancer.
    later = conversations_on(second, names, turn=1)
    moved = [n for n in names if at_10[n] != later[n]]
    if pinning:
        assert moved == []
        fresh = conversations_on(second, [f"new {i}" for i in range(40)])
        assert 8 <= list(fresh.values()).count("vllm") <= 32  # new ones follow the 50%
    else:
        assert moved
        assert all(at_10[n] == "hosted" and later[n] == "vllm" for n in moved)


def test_admin_api_is_guarded(
    setup: Callable[..., Setup], proxies: Callable[[Config], BackgroundServer]
) -> None:
    s = setup()
    proxy = proxies(s.config)
    wrong = cli("rollout", "status", "--proxy-url", proxy.url, key="nope")
    assert wrong.returncode != 0
    assert "admin key" in wrong.stderr
    missing = cli("rollout", "status", "--proxy-url", proxy.url, key="")
    assert missing.returncode != 0
    ok = cli(
        "rollout",
        "--percent",
        "30",
        "--force",
        "--reason",
        "remote",
        "--proxy-url",
        proxy.url,
        key="adm-secret",
    )
    assert ok.returncode == 0, ok.stderr
    history = cli("rollout", "history", "--json", "--proxy-url", proxy.url, key="adm-secret")
    events = json.loads(history.stdout)
    assert events[-1]["reason"] == "remote"
    assert events[-1]["forced"]
    refused = cli("rollout", "--percent", "60", "--proxy-url", proxy.url, key="adm-secret")
    assert refused.returncode != 0
    assert "refused by the gates" in refused.stderr


def test_admin_api_disabled_without_admin_key(
    tmp_path: Path, setup: Callable[..., Setup], proxies: Callable[[Config], BackgroundServer]
) -> None:
    s = setup()
    config = parse_config(s.config_path.read_text().replace("admin_key: adm-secret", ""), env={})
    proxy = proxies(config)
    result = cli("rollout", "status", "--proxy-url", proxy.url, key="anything")
    assert result.returncode != 0
    assert "disabled" in result.stderr


def test_failing_candidate_is_rolled_back_automatically(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
) -> None:
    s = setup(candidate="broken")
    proxy = proxies(s.config)
    assert (
        cli("rollout", "--percent", "100", "--force", "--config", str(s.config_path)).returncode
        == 0
    )
    wait_until(lambda: applied_version(proxy) == 1, DEADLINE_S)
    for i in range(30):  # each falls back to the primary: clients see no error
        assert served_by(proxy, f"c{i}") == "hosted"
    wait_until(
        lambda: (
            json.loads(cli("rollout", "status", "--json", "--config", str(s.config_path)).stdout)[
                "state"
            ]["percent"]
            == 0
        ),
        DEADLINE_S,
    )
    events = json.loads(cli("rollout", "history", "--json", "--config", str(s.config_path)).stdout)
    assert events[-1]["action"] == "auto-rollback"
    assert "error rate" in events[-1]["reason"]
    import urllib.request

    metrics = urllib.request.urlopen(proxy.url + "/metrics").read().decode()
    assert 'kvmigrate_auto_rollbacks_total{cohort="gpt-4o-mini"} 1.0' in metrics


@pytest.fixture
def traffic() -> Iterator[Callable[[BackgroundServer], None]]:
    """Steady multi-turn traffic through a proxy until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def run(proxy: BackgroundServer) -> None:
        offset = len(threads) * 1000

        def loop() -> None:
            i = offset
            while not stop.is_set():
                served_by(proxy, f"steady conversation {i % 50}", turn_messages=i // 50 % 3)
                i += 1

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        threads.append(thread)

    yield run
    stop.set()
    for thread in threads:
        thread.join(10)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("candidate", "completes"), [("vllm", True), ("broken", False)])
def test_rollout_auto_walks_the_steps_through_the_gates(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
    traffic: Callable[[BackgroundServer], None],
    candidate: str,
    completes: bool,
) -> None:
    s = setup(candidate=candidate)
    proxy = proxies(s.config)
    traffic(proxy)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvmigrate",
            "rollout",
            "auto",
            "--bake",
            "1",
            "--poll",
            "0.3",
            # Evidence for a step: ~2 s quiet, 33 s seen beside a CPU hog; the limit is
            # a generous deadline for the gates' evidence, not a bound being tested.
            "--step-timeout",
            "150",
            "--json",
            "--config",
            str(s.config_path),
        ],
        capture_output=True,
        text=True,
        timeout=3 * 150 + 60,
    )
    report = json.loads(result.stdout)
    events = json.loads(cli("rollout", "history", "--json", "--config", str(s.config_path)).stdout)
    if completes:
        assert result.returncode == 0, result.stdout + result.stderr
        assert report["completed"]
        assert report["reached"] == 100
        assert [e["to_percent"] for e in events] == [10, 50, 100]
        assert all(g["verdict"] == "passed" for e in events for g in e["gates"])
        report = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvmigrate",
                "report",
                "--format",
                "json",
                "--since",
                "all",
                "--config",
                str(s.config_path),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        timeline = json.loads(report.stdout)["timeline"]
        assert [e["percent"] for e in timeline] == [10, 50, 100]
    else:
        assert result.returncode == 1
        assert "gates failed before 10%" in report["message"]
        assert events == []  # nothing was promoted


def test_a_watcher_that_fails_unexpectedly_is_restarted_logged_and_counted(
    setup: Callable[..., Setup],
    proxies: Callable[[Config], BackgroundServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = setup()
    proxy = proxies(s.config)
    assert served_by(proxy, "hello") == "hosted"
    state_db = tmp_path / "state.db"

    def write_state(data: str, version: int) -> None:
        with sqlite3.connect(state_db) as db:
            db.execute(
                "INSERT INTO rollout_state (id, data, version) VALUES (1, ?, ?) ON CONFLICT (id) "
                "DO UPDATE SET data = excluded.data, version = excluded.version",
                (data, version),
            )

    def restarts() -> float:
        with urllib.request.urlopen(proxy.url + "/metrics") as response:
            text = response.read().decode()
        lines = [
            line
            for line in text.splitlines()
            if line.startswith('kvmigrate_background_restarts_total{task="rollout-watch"}')
        ]
        return float(lines[0].split()[-1]) if lines else 0.0

    with caplog.at_level(logging.ERROR, logger="kvmigrate.supervisor"):
        # A state the store hands back but the watcher cannot read: not a StoreError.
        write_state('{"mode": "split", "percent": "not a number", "version": 7}', 7)
        wait_until(lambda: restarts() >= 1, timeout=10)
        assert any(
            "background task rollout-watch failed" in r.getMessage() and r.exc_info
            for r in caplog.records
        )
    # Still watching: a later, valid change is applied.
    state = {"mode": "split", "percent": 100.0, "version": 8, "epoch": 0}
    write_state(json.dumps(state), 8)
    wait_until(lambda: served_by(proxy, "after the fix") == "vllm", timeout=20)
